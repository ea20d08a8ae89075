package routing_test

import (
	"context"
	"testing"
	"time"

	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// waitFor polls cond until it holds or the deadline passes. Watches deliver
// asynchronously, so the test waits for the engine to catch up; it measures
// nothing.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func servedBy(s *routing.Service, req routing.Request) string {
	r, err := s.Pick(req)
	if err != nil {
		return err.Error()
	}
	return r.Instance.ID
}

func TestEngineFollowsRegistryAndPolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reg := registry.NewMemory()
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
