package routing_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// outageRegistry is a registry that reports outages (registry.Outages) when
// the test marks them, as the etcd store and the admin API client do when
// they cannot reach their store.
type outageRegistry struct {
	registry.Registry
	clock registry.OutageClock
}

func (r *outageRegistry) LastOutage() time.Time { return r.clock.Last() }

// register registers service/id (in lane) in reg.
func register(t *testing.T, ctx context.Context, reg registry.Registry, service, id, lane string) registry.Lease {
	t.Helper()
	l, err := reg.Register(ctx, registry.Instance{Service: service, ID: id, Addr: "127.0.0.1:1", Lane: lane}, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func ids(s *routing.Service) []string {
	var out []string
	for _, in := range s.Instances() {
		out = append(out, in.ID)
	}
	slices.Sort(out)
	return out
}

// Deregistrations apply at once, every instance of a service at once too,
// when the registry has had no outage; and when its last outage is older
// than the registry's TTL.
func TestEngineAppliesDeregistrations(t *testing.T) {
	registries(t, func(t *testing.T, mem registry.Registry) {
		reg := &outageRegistry{Registry: mem}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		defer reg.Close()
		e := routing.New(routing.WithRegistry(reg))
		defer e.Close()
		orders := e.Service("orders")
		for round, outage := range []time.Time{{}, time.Now().Add(-registry.DefaultTTL - time.Second)} {
			reg.clock.Mark(outage)
			b1 := register(t, ctx, reg, "orders", "b1", "")
			b2 := register(t, ctx, reg, "orders", "b2", "")
			waitFor(t, "the instances", func() bool { return len(orders.Instances()) == 2 })
			b1.Close()
			b2.Close()
			waitFor(t, "the deregistrations", func() bool { return len(orders.Instances()) == 0 })
			if h := e.Held("orders"); len(h) != 0 {
				t.Fatalf("round %d: held %v after deregistrations", round, h)
			}
		}
	})
}

// The instances deleted shortly after an outage of the registry are held:
// the engine routes to them until each registers again or the grace ends.
// The instance of another service deleted just before the outage was known
// is held too.
func TestEngineHoldsAfterOutage(t *testing.T) {
	registries(t, func(t *testing.T, mem registry.Registry) {
		reg := &outageRegistry{Registry: mem}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		defer reg.Close()
		pay := register(t, ctx, reg, "pay", "p1", "")
		var leases []registry.Lease
		for i, lane := range []string{"", "", "alice"} {
			leases = append(leases, register(t, ctx, reg, "orders", fmt.Sprintf("o%d", i+1), lane))
		}
		const grace = 3 * time.Second
		e := routing.New(routing.WithRegistry(reg), routing.WithExpiryGrace(grace))
		defer e.Close()
		orders, paySvc := e.Service("orders"), e.Service("pay")
		waitFor(t, "the instances", func() bool { return len(orders.Instances()) == 3 && len(paySvc.Instances()) == 1 })

		// pay's instance is deleted before the outage is known: applied,
		// then held once it is.
		pay.Close()
		waitFor(t, "pay's deletion", func() bool { return len(paySvc.Instances()) == 0 })
		reg.clock.Mark(time.Now())
		lost := time.Now()
		for _, l := range leases {
			l.Close()
		}
		waitFor(t, "the held instances", func() bool {
			return slices.Equal(e.Held("orders"), []string{"o1", "o2", "o3"}) && slices.Equal(e.Held("pay"), []string{"p1"})
		})
		for _, c := range []struct {
			svc  *routing.Service
			lane string
			want string
		}{{orders, "alice", "o3"}, {paySvc, "", "p1"}} {
			if got := servedBy(c.svc, routing.Request{Lane: c.lane}); got != c.want {
				t.Errorf("%s, lane %q: served by %s while held, want %s", c.svc.Name(), c.lane, got, c.want)
			}
		}
		if got := servedBy(orders, routing.Request{}); got != "o1" && got != "o2" {
			t.Errorf("orders, baseline: served by %s while held", got)
		}

		// o1 registers again: it is no longer held, and serves as
		// registered now.
		again, err := reg.Register(ctx, registry.Instance{Service: "orders", ID: "o1", Addr: "127.0.0.1:2"}, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer again.Close()
		waitFor(t, "o1 registered again", func() bool { return slices.Equal(e.Held("orders"), []string{"o2", "o3"}) })
		for _, in := range orders.Instances() {
			if in.ID == "o1" && in.Addr != "127.0.0.1:2" {
				t.Errorf("o1 at %s, want its new address", in.Addr)
			}
		}

		// The grace ends: the others are gone.
		deadline := time.Now().Add(grace + 10*time.Second)
		for !slices.Equal(ids(orders), []string{"o1"}) || len(paySvc.Instances()) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("after the grace: orders %v, pay %v", ids(orders), ids(paySvc))
			}
			time.Sleep(10 * time.Millisecond)
		}
		if took := time.Since(lost); took < grace {
			t.Errorf("held instances removed after %s, before the grace of %s", took, grace)
		}
		if h := e.Held("orders"); len(h) != 0 {
			t.Errorf("still held after the grace: %v", h)
		}
		if got := servedBy(orders, routing.Request{Lane: "alice"}); got != "o1" {
			t.Errorf("alice served by %s after the grace, want the baseline o1", got)
		}
	})
}
