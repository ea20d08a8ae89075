package etcdstore_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/internal/testkit/timing"
	"github.com/lanesdev/lanes/registry"
)

// The child process of TestLeaseExpiresWhenProcessKilled reads these.
const (
	helperEnv          = "LANES_ETCDSTORE_HELPER"
	helperEndpointsEnv = "LANES_ETCDSTORE_HELPER_ENDPOINTS"
	helperPrefixEnv    = "LANES_ETCDSTORE_HELPER_PREFIX"
)

// killTTL is the lease of the killed child: etcd's minimum with its default
// election timeout.
const killTTL = 2 * time.Second

// TestHelperProcess is not a test: it is the child process of
// TestLeaseExpiresWhenProcessKilled. It registers an instance, says so on
// stdout ("registered"), and keeps the lease alive until it is killed,
// saying "renewed" on every renewal.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "register" {
		t.Skip("the child process of TestLeaseExpiresWhenProcessKilled")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := etcdstore.Open(ctx, etcdstore.Config{
		Endpoints: strings.Split(os.Getenv(helperEndpointsEnv), ","),
		Options:   etcdstore.Options{Prefix: os.Getenv(helperPrefixEnv)},
	})
	if err != nil {
		t.Fatal(err)
	}
	var registered atomic.Bool
	etcdstore.OnRenew(s, func(string, clientv3.LeaseID, time.Time) {
		if registered.Load() {
			os.Stdout.WriteString("renewed\n")
		}
	})
	if _, err := s.Register(ctx, inst("orders", "child", 1), killTTL); err != nil {
		t.Fatal(err)
	}
	registered.Store(true)
	os.Stdout.WriteString("registered\n")
	<-ctx.Done() // the parent kills us long before
	t.Fatal("helper process was not killed")
}

// TestLeaseExpiresWhenProcessKilled registers an instance from a child
// process, lets it renew its lease, kills it with SIGKILL and measures how
// long the instance takes to disappear: at most its TTL plus etcd's
// expiry-check period and some slack.
func TestLeaseExpiresWhenProcessKilled(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		ctx := testCtx(t)
		s := open(t, srv)
		w := watchStore(t, s, "orders")
		if b, err := w.Next(ctx); err != nil || !b.Reset || len(b.Events) != 0 {
			t.Fatalf("first batch %+v, %v", b, err)
		}

		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(),
			helperEnv+"=register",
			helperEndpointsEnv+"="+strings.Join(srv.Endpoints(), ","),
			helperPrefixEnv+"="+s.Prefix())
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		defer func() {
			cmd.Process.Kill()
			<-exited
		}()
		lines := make(chan string, 64)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		say := func(want string) {
			t.Helper()
			select {
			case l, ok := <-lines:
				if !ok || l != want {
					t.Fatalf("child said %q (open: %v), want %q", l, ok, want)
				}
			case <-ctx.Done():
				t.Fatalf("child did not say %q", want)
			}
		}
		say("registered")

		b, err := w.Next(ctx)
		if err != nil || len(b.Events) != 1 || b.Events[0].Type != registry.EventPut || b.Events[0].Instance.ID != "child" {
			t.Fatalf("want the child's put, got %+v, %v", b, err)
		}
		// Let the child renew its lease three times (a TTL): the key is
		// still held by the same lease.
		leaseID := leaseOf(t, s, "orders", "child")
		for range 3 {
			say("renewed")
		}
		if got := leaseOf(t, s, "orders", "child"); got != leaseID {
			t.Fatalf("the child's instance moved from lease %x to %x", leaseID, got)
		}
		ttl, err := s.Client().TimeToLive(ctx, leaseID)
		if err != nil {
			t.Fatal(err)
		}
		if ttl.TTL < 0 || ttl.GrantedTTL != int64(killTTL/time.Second) {
			t.Fatalf("the child's lease: %ds left of %ds granted, want a live lease of %v", ttl.TTL, ttl.GrantedTTL, killTTL)
		}

		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		<-exited
		exited <- nil // for the deferred cleanup

		b, err = w.Next(ctx)
		gone := time.Since(killed)
		if err != nil || len(b.Events) != 1 || b.Events[0].Type != registry.EventDelete || b.Events[0].Instance.ID != "child" {
			t.Fatalf("want the child's delete, got %+v, %v", b, err)
		}
		// The last renewal was at most TTL/3 before the kill; etcd checks
		// for expired leases every 500ms, then revokes the lease with a
		// raft write, whose delete the watch delivers. The slack leaves
		// room for that on a loaded machine, and the bound stays well
		// below a lease of the default TTL (10s): it is the child's lease
		// that ended, not another.
		const slack = 3 * time.Second
		t.Logf("instance gone %v after SIGKILL (TTL %v)", gone.Round(time.Millisecond), killTTL)
		if gone > killTTL+slack {
			t.Fatalf("instance gone %v after SIGKILL, want at most TTL %v + %v", gone, killTTL, slack)
		}
	})
}

// leaseOf returns the lease that holds an instance key.
func leaseOf(t *testing.T, s *etcdstore.Store, service, id string) clientv3.LeaseID {
	t.Helper()
	r, err := s.Client().Get(testCtx(t), s.Prefix()+"instances/"+service+"/"+id)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) != 1 {
		t.Fatalf("instance %s/%s is not registered", service, id)
	}
	return clientv3.LeaseID(r.Kvs[0].Lease)
}

// TestLeaseReestablished revokes a registration's lease behind its back, as
// an expiry during a long etcd outage would, and checks that the Lease
// registers the instance again under a new lease without being closed.
func TestLeaseReestablished(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		ctx := testCtx(t)
		s := open(t, srv)
		w := watchStore(t, s, "orders")
		w.Next(ctx) // the reset
		a := inst("orders", "a", 1)
		// A short TTL, so that the revoke is noticed soon; scaled, so that a
		// process starved under -race does not lose the lease on its own.
		l, err := s.Register(ctx, a, timing.Bound(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		next := func() registry.Event {
			t.Helper()
			b, err := w.Next(ctx)
			if err != nil || len(b.Events) != 1 {
				t.Fatalf("want one event, got %+v, %v", b, err)
			}
			return b.Events[0]
		}
		if ev := next(); ev.Type != registry.EventPut {
			t.Fatalf("got %+v", ev)
		}
		old := leaseOf(t, s, "orders", "a")
		if _, err := s.Client().Revoke(ctx, old); err != nil {
			t.Fatal(err)
		}
		revoked := time.Now()
		if ev := next(); ev.Type != registry.EventDelete {
			t.Fatalf("after revoke got %+v", ev)
		}
		ev := next()
		want, _ := registry.Normalize(a)
		if ev.Type != registry.EventPut || !ev.Instance.Equal(want) {
			t.Fatalf("after revoke want the instance again, got %+v", ev)
		}
		t.Logf("registered again %v after the revoke", time.Since(revoked).Round(time.Millisecond))
		if nl := leaseOf(t, s, "orders", "a"); nl == old {
			t.Fatal("registered again under the revoked lease")
		}
		select {
		case <-l.Done():
			t.Fatalf("lease ended: %v", l.Err())
		default:
		}
		// The new lease is the Lease's: Update and Close use it.
		a.Drain = true
		if err := l.Update(ctx, a); err != nil {
			t.Fatal(err)
		}
		if ev := next(); ev.Type != registry.EventPut || !ev.Instance.Drain {
			t.Fatalf("after Update got %+v", ev)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if ev := next(); ev.Type != registry.EventDelete {
			t.Fatalf("after Close got %+v", ev)
		}
	})
}

// TestStoreCloseLeavesLeasesToExpire checks that closing the Store stops
// renewing its leases without deregistering: the instance disappears after
// its TTL, as if the process had died, and the Lease reports ErrClosed.
func TestStoreCloseLeavesLeasesToExpire(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		ctx := testCtx(t)
		prefix := uniquePrefix()
		watching := openPrefix(t, srv, prefix)
		w, err := watching.Watch(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		w.Next(ctx)

		s, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: srv.Endpoints(), Options: etcdstore.Options{Prefix: prefix, Logger: testLogger}})
		if err != nil {
			t.Fatal(err)
		}
		l, err := s.Register(ctx, inst("orders", "a", 1), 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if b, err := w.Next(ctx); err != nil || b.Events[0].Type != registry.EventPut {
			t.Fatalf("%+v %v", b, err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		closed := time.Now()
		select {
		case <-l.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("Done not closed after the Store closed")
		}
		if !errors.Is(l.Err(), registry.ErrClosed) {
			t.Fatalf("Err() = %v, want ErrClosed", l.Err())
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		b, err := w.Next(ctx)
		if err != nil || b.Events[0].Type != registry.EventDelete {
			t.Fatalf("%+v %v", b, err)
		}
		if d := time.Since(closed); d < time.Second {
			t.Fatalf("instance gone %v after Store.Close: it was deregistered, not left to expire", d)
		}
	})
}

// TestRenewalsLogInOnce renews registrations with etcd's authentication on
// and counts the client's log-ins (Authenticate calls, each a bcrypt hash
// and a raft write on the member): the etcd client logs in for every stream
// it opens, so renewals must reuse their streams. Renewals made one after
// another use one stream; kept leases renewing side by side, one each at
// most. After the user's tokens are revoked (its password set again), a
// renewal on a kept stream is refused, and the next one, on a new stream,
// logs in again and succeeds. (etcd 3.4 does not check tokens on renewals:
// there the kept stream goes on.)
func TestRenewalsLogInOnce(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		enableAuth(t, srv)
		ctx := testCtx(t)
		var logins atomic.Int64
		count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if method == "/etcdserverpb.Auth/Authenticate" {
				logins.Add(1)
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		c, err := clientv3.New(clientv3.Config{
			Endpoints: srv.Endpoints(), DialTimeout: 5 * time.Second,
			Username: "lanes", Password: "s3cret",
			DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)},
			Logger:      zap.NewNop(),
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := etcdstore.New(c, etcdstore.Options{Prefix: "/lanes/" + t.Name() + "/", Logger: testLogger})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		regs := s.Registrations()
		var leases []clientv3.LeaseID
		for i := range 4 {
			reg, err := regs.Create(ctx, inst("orders", fmt.Sprint("r", i), 1), 30*time.Second, etcdstore.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			leases = append(leases, reg.Lease)
		}
		before := logins.Load()
		for range 5 {
			for _, l := range leases {
				if _, err := regs.Renew(ctx, l); err != nil {
					t.Fatal(err)
				}
			}
		}
		if n := logins.Load() - before; n > 1 {
			t.Errorf("20 renewals, one after another, logged in %d times; want at most once (one stream)", n)
		}

		// Kept leases, renewing side by side every second.
		const kept, rounds = 3, 4
		var mu sync.Mutex
		renewed := map[string]int{}
		done := make(chan struct{})
		var once sync.Once
		etcdstore.OnRenew(s, func(key string, _ clientv3.LeaseID, _ time.Time) {
			mu.Lock()
			defer mu.Unlock()
			renewed[key]++
			if len(renewed) == kept && minCount(renewed) > rounds { // the grant, then the renewals
				once.Do(func() { close(done) })
			}
		})
		before = logins.Load()
		var keptLeases []registry.Lease
		for i := range kept {
			l, err := s.Register(ctx, inst("orders", fmt.Sprint("k", i), 1), 3*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			keptLeases = append(keptLeases, l)
		}
		select {
		case <-done:
		case <-ctx.Done():
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("the kept leases were not renewed %d times each: %v", rounds, renewed)
		}
		if n := logins.Load() - before; n > kept {
			t.Errorf("%d kept leases renewing %d times each logged in %d times; want at most %d (a stream each)", kept, rounds, n, kept)
		}
		for _, l := range keptLeases {
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
		}

		// Revoke the user's tokens: a kept stream is refused, a new one
		// logs in.
		root, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints(), DialTimeout: 5 * time.Second, Username: "root", Password: etcdtest.RootPassword, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		if _, err := root.UserChangePassword(ctx, "lanes", "s3cret"); err != nil {
			t.Fatal(err)
		}
		before = logins.Load()
		if _, err := regs.Renew(ctx, leases[0]); err != nil {
			t.Fatalf("renewal after the user's tokens were revoked: %v", err)
		}
		if srv.Kind() == "embedded" && logins.Load() == before {
			t.Error("the renewal after the user's tokens were revoked did not log in again: was the kept stream not refused?")
		}
	})
}

func minCount(m map[string]int) int {
	n := -1
	for _, v := range m {
		if n < 0 || v < n {
			n = v
		}
	}
	return n
}
