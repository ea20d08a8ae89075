package kube

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/registry"
)

// follow reads the instances of orders in r (id → lane) as they change,
// until until holds.
func follow(t *testing.T, r registry.Registry, until func(map[string]string) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w, err := r.Watch(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var st registry.State
	for {
		b, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("%v (have %v)", err, st.Services["orders"])
		}
		st.Apply(b)
		got := map[string]string{}
		for id, in := range st.Services["orders"] {
			got[id] = in.Lane
		}
		if until(got) {
			return
		}
	}
}

// TestMirror: what registers in one registry is registered in the other,
// updated and ended with it; when the mirror stops, its registrations are
// left to the next mirror, which takes them over and ends them with the
// instance.
func TestMirror(t *testing.T) {
	from, to := registry.NewMemory(), registry.NewMemory()
	defer from.Close()
	defer to.Close()
	ctx, cancel := context.WithCancel(context.Background())
	m := &mirror{from: from, to: to, log: slog.New(slog.DiscardHandler)}
	done := make(chan struct{})
	go func() { defer close(done); m.run(ctx) }()
	defer func() { cancel(); <-done }()

	l, err := from.Register(ctx, registry.Instance{Service: "orders", ID: "laptop", Lane: "alice", Addr: "10.0.0.1:80"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	follow(t, to, func(m map[string]string) bool { return m["laptop"] == "alice" })
	if err := l.Update(ctx, registry.Instance{Service: "orders", ID: "laptop", Lane: "bob", Addr: "10.0.0.1:80"}); err != nil {
		t.Fatal(err)
	}
	follow(t, to, func(m map[string]string) bool { return m["laptop"] == "bob" })
	l.Close()
	follow(t, to, func(m map[string]string) bool { return len(m) == 0 })

	dev, err := from.Register(ctx, registry.Instance{Service: "orders", ID: "dev", Addr: "10.0.0.2:80"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	follow(t, to, func(m map[string]string) bool { _, ok := m["dev"]; return ok })
	cancel()
	<-done
	follow(t, to, func(m map[string]string) bool { // the first state: dev is left
		if _, ok := m["dev"]; !ok || len(m) != 1 {
			t.Fatalf("after the mirror stopped: %v, want dev left registered", m)
		}
		return true
	})

	// The next leader's mirror.
	ctx2, cancel2 := context.WithCancel(context.Background())
	m2 := &mirror{from: from, to: to, log: slog.New(slog.DiscardHandler)}
	done2 := make(chan struct{})
	go func() { defer close(done2); m2.run(ctx2) }()
	defer func() { cancel2(); <-done2 }()
	if err := dev.Update(ctx2, registry.Instance{Service: "orders", ID: "dev", Lane: "carol", Addr: "10.0.0.2:80"}); err != nil {
		t.Fatal(err)
	}
	follow(t, to, func(m map[string]string) bool { return m["dev"] == "carol" })
	dev.Close()
	follow(t, to, func(m map[string]string) bool { return len(m) == 0 })
}

// TestMirrorRefused: a cluster that refuses every write is said once, not
// once for each instance.
func TestMirrorRefused(t *testing.T) {
	from, to := registry.NewMemory(), registry.NewMemory()
	defer from.Close()
	to.Close() // refuses every registration
	var log bytes.Buffer
	m := &mirror{from: from, to: to, log: slog.New(slog.NewTextHandler(&log, nil))}
	var st registry.State
	for i := range 20 {
		st.Apply(registry.Batch{Events: []registry.Event{{Type: registry.EventPut, Instance: registry.Instance{Service: "orders", ID: "i" + string(rune('a'+i)), Addr: "10.0.0.1:80"}}}})
		m.reconcile(context.Background(), &st, map[[2]string]registry.Lease{})
	}
	if n := strings.Count(log.String(), "mirror: register in the cluster"); n != 1 {
		t.Fatalf("%d lines for 20 refused instances, want 1:\n%s", n, log.String())
	}
}
