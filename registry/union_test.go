package registry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/registrytest"
	"github.com/lanesdev/lanes/registry"
)

// TestUnionConformance: a union of two registries is a registry as any
// other, with the other member holding instances of other services.
func TestUnionConformance(t *testing.T) {
	registrytest.Run(t, func(t *testing.T) registry.Registry {
		a, b := registry.NewMemory(), registry.NewMemory()
		t.Cleanup(func() { a.Close(); b.Close() })
		return registry.Union(a, b)
	})
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// view follows a watch into a registry.State.
type view struct {
	t *testing.T
	w registry.Watcher
	s registry.State
}

func follow(t *testing.T, r registry.Registry, service string) *view {
	t.Helper()
	w, err := r.Watch(ctxT(t), service)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	v := &view{t: t, w: w}
	v.next()
	return v
}

func (v *view) next() registry.Batch {
	v.t.Helper()
	b, err := v.w.Next(ctxT(v.t))
	if err != nil {
		v.t.Fatal(err)
	}
	v.s.Apply(b)
	return b
}

// until reads batches until the instances of service are want (id → lane
// and address).
func (v *view) until(service string, want map[string]string) {
	v.t.Helper()
	for !v.is(service, want) {
		v.next()
	}
}

func (v *view) is(service string, want map[string]string) bool {
	got := v.s.Services[service]
	if len(got) != len(want) {
		return false
	}
	for id, w := range want {
		in, ok := got[id]
		if !ok || in.Lane+"@"+in.Addr != w {
			return false
		}
	}
	return true
}

func reg(t *testing.T, r registry.Registry, id, lane, addr string) registry.Lease {
	t.Helper()
	l, err := r.Register(ctxT(t), registry.Instance{ID: id, Service: "orders", Lane: lane, Addr: addr}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestUnionShadow: an instance that an earlier member also has, by ID or by
// address, is the earlier member's; the later one's appears when the
// earlier one goes.
func TestUnionShadow(t *testing.T) {
	etcd, kube := registry.NewMemory(), registry.NewMemory()
	defer etcd.Close()
	defer kube.Close()
	u := registry.Union(etcd, kube)
	defer u.Close()

	pod := reg(t, kube, "orders-1.default", "", "10.0.0.1:80") // a pod without a lane label
	reg(t, kube, "orders-2.default", "", "10.0.0.2:80")
	v := follow(t, u, "orders")
	v.until("orders", map[string]string{"orders-1.default": "@10.0.0.1:80", "orders-2.default": "@10.0.0.2:80"})

	// The pod's process registers itself in a lane: its endpoint is no
	// baseline instance any more.
	self := reg(t, etcd, "orders-x", "alice", "10.0.0.1:80")
	v.until("orders", map[string]string{"orders-x": "alice@10.0.0.1:80", "orders-2.default": "@10.0.0.2:80"})

	// The same ID in both: the first member's.
	dup := reg(t, etcd, "orders-2.default", "bob", "10.0.0.9:80")
	v.until("orders", map[string]string{"orders-x": "alice@10.0.0.1:80", "orders-2.default": "bob@10.0.0.9:80"})
	dup.Close()
	v.until("orders", map[string]string{"orders-x": "alice@10.0.0.1:80", "orders-2.default": "@10.0.0.2:80"})

	// The registration ends: the endpoint is back as the pod has it.
	self.Close()
	v.until("orders", map[string]string{"orders-1.default": "@10.0.0.1:80", "orders-2.default": "@10.0.0.2:80"})

	// A registration through the union is the first member's.
	l := reg(t, u, "orders-y", "carol", "10.0.0.3:80")
	if l.Instance().Lane != "carol" {
		t.Fatalf("lease of %+v", l.Instance())
	}
	w, _ := etcd.Watch(ctxT(t), "orders")
	defer w.Close()
	if b, _ := w.Next(ctxT(t)); len(b.Events) != 1 || b.Events[0].Instance.ID != "orders-y" {
		t.Fatalf("the first member holds %+v, want orders-y alone", b.Events)
	}
	pod.Close()
	v.until("orders", map[string]string{"orders-y": "carol@10.0.0.3:80", "orders-2.default": "@10.0.0.2:80"})
}

// TestUnionStart: a watch's first batch is a reset of every member's
// instances, whatever the order in which the members answer.
func TestUnionStart(t *testing.T) {
	a, b := registry.NewMemory(), registry.NewMemory()
	defer a.Close()
	defer b.Close()
	reg(t, a, "a1", "", "10.0.0.1:80")
	reg(t, b, "b1", "alice", "10.0.0.2:80")
	u := registry.Union(a, b)
	defer u.Close()
	w, err := u.Watch(ctxT(t), "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	batch, err := w.Next(ctxT(t))
	if err != nil || !batch.Reset || len(batch.Events) != 2 {
		t.Fatalf("first batch %+v, %v: want a reset of 2", batch, err)
	}
}

// TestUnionClose: closing the union ends its watches with ErrClosed and
// refuses new ones; the members go on.
func TestUnionClose(t *testing.T) {
	a, b := registry.NewMemory(), registry.NewMemory()
	defer a.Close()
	defer b.Close()
	u := registry.Union(a, b)
	v := follow(t, u, "")
	u.Close()
	if _, err := v.w.Next(ctxT(t)); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Next after Close: %v, want ErrClosed", err)
	}
	if _, err := u.Watch(ctxT(t), ""); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Watch after Close: %v, want ErrClosed", err)
	}
	reg(t, a, "a1", "", "10.0.0.1:80")
}

// TestUnionMemberEnds: a member closed under a watch ends it, after what
// came before.
func TestUnionMemberEnds(t *testing.T) {
	a, b := registry.NewMemory(), registry.NewMemory()
	defer a.Close()
	u := registry.Union(a, b)
	defer u.Close()
	v := follow(t, u, "")
	b.Close()
	if _, err := v.w.Next(ctxT(t)); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Next after a member closed: %v, want ErrClosed", err)
	}
}

// outages is a registry that reports an outage.
type outages struct {
	registry.Registry
	at time.Time
}

func (o outages) LastOutage() time.Time { return o.at }

// TestUnionOutages: the union's last outage is its members' latest.
func TestUnionOutages(t *testing.T) {
	m := registry.NewMemory()
	defer m.Close()
	t0 := time.Unix(1000, 0)
	u := registry.Union(m, outages{m, t0}, outages{m, t0.Add(time.Second)})
	if got := u.(registry.Outages).LastOutage(); !got.Equal(t0.Add(time.Second)) {
		t.Fatalf("LastOutage %v", got)
	}
}
