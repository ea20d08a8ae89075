package routing_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/timing"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// waitFor polls cond until it holds or the deadline passes. Watches deliver
// asynchronously, so the test waits for the engine to catch up; it measures
// nothing.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	timing.Until(t, what, 5*time.Second, cond)
}

func servedBy(s *routing.Service, req routing.Request) string {
	r, err := s.Pick(req)
	if err != nil {
		return err.Error()
	}
	return r.Instance.ID
}

// registries runs fn on a memory registry, as it is and with watchers that
// are registry.Pushers (whose batches an engine takes in the watcher's
// goroutine).
func registries(t *testing.T, fn func(t *testing.T, reg registry.Registry)) {
	t.Run("next", func(t *testing.T) { fn(t, registry.NewMemory()) })
	t.Run("push", func(t *testing.T) { fn(t, pushRegistry{registry.NewMemory()}) })
}

// pushRegistry is a registry whose watchers are registry.Pushers: Push
// hands over what a goroutine of the watcher reads from Next.
type pushRegistry struct{ registry.Registry }

func (r pushRegistry) Watch(ctx context.Context, service string) (registry.Watcher, error) {
	w, err := r.Registry.Watch(ctx, service)
	if err != nil {
		return nil, err
	}
	return &pushWatcher{Watcher: w}, nil
}

type pushWatcher struct {
	registry.Watcher
	done chan struct{} // closed when the goroutine of Push returns
}

func (w *pushWatcher) Push(fn func(registry.Batch)) <-chan struct{} {
	w.done = make(chan struct{})
	go func() {
		defer close(w.done)
		for {
			b, err := w.Watcher.Next(context.Background())
			if err != nil {
				return // closed
			}
			fn(b)
		}
	}()
	return w.done
}

func (w *pushWatcher) Close() error {
	err := w.Watcher.Close()
	if w.done != nil {
		<-w.done
	}
	return err
}

func TestEngineFollowsRegistryAndPolicy(t *testing.T) { registries(t, testEngineFollows) }

func testEngineFollows(t *testing.T, reg registry.Registry) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	defer reg.Close()
	store := policy.NewMemory()

	base, err := reg.Register(ctx, registry.Instance{ID: "b1", Service: "orders", Addr: "127.0.0.1:9001"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close()

	e := routing.New(routing.WithRegistry(reg), routing.WithPolicyStore(store))
	defer e.Close()
	orders := e.Service("orders")
	if err := orders.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	<-e.PolicyReady()
	if got := servedBy(orders, routing.Request{Lane: "alice"}); got != "b1" {
		t.Fatalf("alice served by %s before any lane instance", got)
	}

	team, err := reg.Register(ctx, registry.Instance{ID: "t1", Service: "orders", Addr: "127.0.0.1:9002", Lane: "team-a"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Put(ctx, []byte("lanes:\n  alice: {fallback: [team-a]}\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the policy and the new instance", func() bool { return servedBy(orders, routing.Request{Lane: "alice"}) == "t1" })

	// Draining moves traffic away without deregistering.
	in := team.Instance()
	in.Drain = true
	if err := team.Update(ctx, in); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the drain", func() bool { return servedBy(orders, routing.Request{Lane: "alice"}) == "b1" })

	team.Close()
	base.Close()
	waitFor(t, "the deregistrations", func() bool {
		_, err := orders.Pick(routing.Request{})
		return err != nil
	})
}

// Changes that arrive while the engine waits out the calm after a rebuild
// are published together, and the last one is always published.
func TestEngineCoalescesChurn(t *testing.T) { registries(t, testEngineCoalesces) }

func testEngineCoalesces(t *testing.T, reg registry.Registry) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	defer reg.Close()
	const n, changes = 2000, 100
	leases := make([]registry.Lease, n)
	for i := range n {
		l, err := reg.Register(ctx, registry.Instance{ID: fmt.Sprintf("i%04d", i), Service: "orders", Addr: fmt.Sprintf("10.0.%d.%d:8080", i>>8, i&255)}, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		leases[i] = l
	}
	e := routing.New(routing.WithRegistry(reg))
	defer e.Close()
	orders := e.Service("orders")
	waitFor(t, "the listing", func() bool { return len(orders.Instances()) == n })

	published := make(chan int)
	stop := make(chan struct{})
	go func() {
		count := 0
		for {
			ch := orders.Changed()
			select {
			case <-ch:
				count++
			case <-stop:
				published <- count
				return
			}
		}
	}()
	for c := range changes {
		in := leases[c].Instance()
		in.Weight = 7
		if err := leases[c].Update(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the last change", func() bool {
		for _, in := range orders.Instances() {
			if in.ID == fmt.Sprintf("i%04d", changes-1) {
				return in.Weight == 7
			}
		}
		return false
	})
	close(stop)
	if got := <-published; got >= changes {
		t.Errorf("%d changes published %d times: not coalesced", changes, got)
	}
	weights := 0
	for _, in := range orders.Instances() {
		if in.Weight == 7 {
			weights++
		}
	}
	if weights != changes {
		t.Errorf("%d instances changed, want %d", weights, changes)
	}
}
