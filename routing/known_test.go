package routing

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/timing"
	"github.com/lanesdev/lanes/registry"
)

// TestKnownLane: a lane is known when the policy names it (lane settings,
// fallbacks, canaries, tags) or an instance of a service the engine knows is
// in it; with WithRegistryLanes, an instance of any service in the registry.
// A lane stops being known when its last instance goes. The lookup
// allocates nothing.
func TestKnownLane(t *testing.T) {
	reg := registry.NewMemory()
	defer reg.Close()
	e := New(WithRegistry(reg), WithRegistryLanes())
	defer e.Close()
	e.SetPolicy(mustPolicy(t, `
lanes:
  team-b: {fallback: [team-a]}
canary:
  - {service: payments, lane: canary, percent: 10}
tags:
  - {service: orders, lane: tagged, labels: {v: "2"}}
`))
	waitUnknown(t, e, "bob", true)
	for _, l := range []string{"team-b", "team-a", "canary", "tagged"} {
		if !e.KnownLane(l) {
			t.Errorf("lane %s, which the policy names, is not known", l)
		}
	}
	for _, l := range []string{"bob", ""} {
		if e.KnownLane(l) {
			t.Errorf("lane %q is known", l)
		}
	}
	// An instance of a service that the engine does not route.
	ctx := context.Background()
	lease, err := reg.Register(ctx, registry.Instance{Service: "mailer", ID: "m-bob", Addr: "127.0.0.1:1", Lane: "bob"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitKnown(t, e, "bob", true)
	if e.UnknownLane("bob") {
		t.Error("lane bob, with an instance, is unknown")
	}
	lease.Close()
	waitKnown(t, e, "bob", false)
	if !e.UnknownLane("bob") {
		t.Error("lane bob, whose last instance went, is not unknown")
	}

	// Without WithRegistryLanes: the lanes of the services the engine routes.
	e2 := New()
	defer e2.Close()
	e2.SetInstances("orders", []registry.Instance{{Service: "orders", ID: "o-dave", Addr: "127.0.0.1:2", Lane: "dave"}})
	if !e2.KnownLane("dave") || e2.KnownLane("bob") {
		t.Errorf("dave known %v, bob known %v; want true, false", e2.KnownLane("dave"), e2.KnownLane("bob"))
	}
	if e2.UnknownLane("bob") {
		t.Error("an engine that does not follow the registry's lanes calls a lane unknown")
	}
	e2.SetInstances("orders", nil)
	if e2.KnownLane("dave") {
		t.Error("dave is known after its last instance went")
	}
	if n := testing.AllocsPerRun(100, func() { e.KnownLane("team-a"); e.UnknownLane("nowhere") }); n != 0 {
		t.Errorf("KnownLane: %.1f allocations, want 0", n)
	}
}

// waitKnown waits until e.KnownLane(l) is want: the registry watch applies
// changes on its own goroutine.
func waitKnown(t *testing.T, e *Engine, l string, want bool) {
	t.Helper()
	waitFor(t, "lane "+l+" known", want, func() bool { return e.KnownLane(l) })
}

// waitUnknown waits until e.UnknownLane(l) is want.
func waitUnknown(t *testing.T, e *Engine, l string, want bool) {
	t.Helper()
	waitFor(t, "lane "+l+" unknown", want, func() bool { return e.UnknownLane(l) })
}

func waitFor(t *testing.T, what string, want bool, f func() bool) {
	t.Helper()
	timing.Until(t, fmt.Sprintf("%s to be %v", what, want), 30*time.Second, func() bool { return f() == want })
}
