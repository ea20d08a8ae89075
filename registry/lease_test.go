package registry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/testkit/buftest"
	"github.com/lanesdev/lanes/registry"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// keeper is a registry.Keeper that the test drives: each Keep and Restore
// takes its answer from a channel.
type keeper struct {
	keep     chan error // Keep returns what it receives
	restore  chan error
	restored chan registry.Instance
	released chan struct{}
}

func newKeeper() *keeper {
	return &keeper{keep: make(chan error), restore: make(chan error), restored: make(chan registry.Instance, 10), released: make(chan struct{}, 10)}
}

func (k *keeper) Keep(ctx context.Context) error {
	select {
	case err := <-k.keep:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (k *keeper) Restore(ctx context.Context, inst registry.Instance) error {
	select {
	case err := <-k.restore:
		if err == nil {
			k.restored <- inst
		}
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (k *keeper) Put(context.Context, registry.Instance) error { return nil }
func (k *keeper) Release(context.Context) error {
	k.released <- struct{}{}
	return nil
}

const patience = 20 * time.Second

func start(t *testing.T, parent context.Context, k *keeper) (*registry.KeptLease, chan struct{}) {
	t.Helper()
	inst := registry.Instance{Service: "orders", ID: "a", Addr: "10.0.0.1:1"}
	l := registry.NewKeptLease(parent, inst, k, quiet)
	ran := make(chan struct{})
	l.Start(func(f func()) bool {
		go func() { defer close(ran); f() }()
		return true
	})
	return l, ran
}

func send(t *testing.T, ch chan error, err error) {
	t.Helper()
	select {
	case ch <- err:
	case <-time.After(patience):
		t.Fatal("the lease did not call its keeper")
	}
}

// A lost registration is made again, with the instance as last updated, and
// the lease goes on; Close releases it.
func TestKeptLeaseRestores(t *testing.T) {
	k := newKeeper()
	l, ran := start(t, context.Background(), k)
	upd := l.Instance()
	upd.Drain = true
	if err := l.Update(context.Background(), upd); err != nil {
		t.Fatal(err)
	}
	send(t, k.keep, errors.New("lost"))
	send(t, k.restore, errors.New("etcd unreachable")) // retried
	send(t, k.restore, nil)
	if got := <-k.restored; !got.Drain {
		t.Errorf("restored %+v, want the updated instance", got)
	}
	send(t, k.keep, errors.New("lost again")) // it keeps the new one
	send(t, k.restore, nil)
	<-k.restored
	if err := l.Err(); err != nil {
		t.Fatalf("Err = %v on a restored lease", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	<-ran
	if len(k.released) != 1 || !errors.Is(l.Err(), registry.ErrClosed) {
		t.Fatalf("after Close: %d releases, Err %v", len(k.released), l.Err())
	}
}

// A registration taken over by another is left alone: no more renewals,
// the lease stays open until Close.
func TestKeptLeaseTakenOver(t *testing.T) {
	k := newKeeper()
	l, ran := start(t, context.Background(), k)
	send(t, k.keep, errors.New("lost"))
	send(t, k.restore, registry.ErrTakenOver)
	select {
	case k.keep <- nil:
		t.Fatal("the lease renews a registration taken over by another")
	case <-l.Done():
		t.Fatalf("the lease ended: %v", l.Err())
	case <-time.After(100 * time.Millisecond): // nothing happens: a short look is enough
	}
	l.Close()
	<-ran
}

// A refusal that wraps ErrLeaseLost ends the lease, with no release.
func TestKeptLeaseLost(t *testing.T) {
	k := newKeeper()
	l, ran := start(t, context.Background(), k)
	send(t, k.keep, fmt.Errorf("%w: token revoked", registry.ErrLeaseLost))
	select {
	case <-l.Done():
	case <-time.After(patience):
		t.Fatal("the lease did not end")
	}
	<-ran
	if !errors.Is(l.Err(), registry.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", l.Err())
	}
	if err := l.Update(context.Background(), l.Instance()); !errors.Is(err, registry.ErrClosed) {
		t.Errorf("Update of a lost lease = %v", err)
	}
	l.Close()
	if len(k.released) != 0 {
		t.Error("a lost lease was released")
	}
}

// When the backend closes, the lease ends without releasing: the
// registration expires with its TTL, as if the process had died.
func TestKeptLeaseBackendClosed(t *testing.T) {
	k := newKeeper()
	parent, cancel := context.WithCancel(context.Background())
	l, ran := start(t, parent, k)
	cancel()
	<-ran
	if !errors.Is(l.Err(), registry.ErrClosed) {
		t.Fatalf("Err = %v, want ErrClosed", l.Err())
	}
	l.Close()
	if len(k.released) != 0 {
		t.Error("released after the backend closed")
	}
}

// Leave stops renewing without releasing: the registration is left to its
// TTL or to the next registration of the instance; Close then does nothing.
func TestKeptLeaseLeave(t *testing.T) {
	k := newKeeper()
	l, ran := start(t, context.Background(), k)
	send(t, k.keep, errors.New("lost"))
	send(t, k.restore, nil)
	<-k.restored
	l.Leave()
	<-ran
	if !errors.Is(l.Err(), registry.ErrClosed) {
		t.Fatalf("Err = %v after Leave, want ErrClosed", l.Err())
	}
	if err := l.Close(); err != nil || len(k.released) != 0 {
		t.Fatalf("Close after Leave: %v, %d releases; want none", err, len(k.released))
	}
	if err := l.Update(context.Background(), l.Instance()); !errors.Is(err, registry.ErrClosed) {
		t.Errorf("Update after Leave = %v, want ErrClosed", err)
	}
}

// The loss of a registration and its recovery are logged, the recovery with
// how long the instance was gone.
func TestKeptLeaseLogsRecovery(t *testing.T) {
	var buf buftest.Buffer
	k := newKeeper()
	inst := registry.Instance{Service: "orders", ID: "a", Addr: "10.0.0.1:1"}
	l := registry.NewKeptLease(context.Background(), inst, k, slog.New(slog.NewTextHandler(&buf, nil)))
	ran := make(chan struct{})
	l.Start(func(f func()) bool {
		go func() { defer close(ran); f() }()
		return true
	})
	send(t, k.keep, errors.New("lease expired"))
	send(t, k.restore, nil)
	<-k.restored
	deadline := time.Now().Add(patience)
	for !strings.Contains(buf.String(), "registered again after ") {
		if time.Now().After(deadline) {
			t.Fatalf("no recovery line in the log:\n%s", buf.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	out := buf.String()
	if !strings.Contains(out, `msg="registration lost; registering again" service=orders id=a err="lease expired"`) ||
		!regexp.MustCompile(`msg="registered again after \d+\.\ds" service=orders id=a after=\S+`).MatchString(out) {
		t.Errorf("log:\n%s", out)
	}
	l.Close()
	<-ran
}

// A registration that the registry says is gone (its lease expired) is made
// again at once, not after a backoff, however often that happens, as long
// as Keep ran for a while: eight losses in a row cost no waiting, where the
// backoff would have added 4.5s at least.
func TestKeptLeaseRestoresGoneAtOnce(t *testing.T) {
	k := newKeeper()
	l, ran := start(t, context.Background(), k)
	begin := time.Now()
	const rounds, kept = 8, 150 * time.Millisecond
	for range rounds {
		time.Sleep(kept) // the scenario: the lease was kept for a while
		send(t, k.keep, fmt.Errorf("lease 1f: %w", registry.ErrGone))
		send(t, k.restore, nil)
		<-k.restored
	}
	if took := time.Since(begin); took > rounds*kept+3*time.Second {
		t.Errorf("%d losses took %s: the lease waited between them", rounds, took)
	}
	l.Close()
	<-ran
}
