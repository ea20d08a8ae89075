package kubestore_test

import (
	"context"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/kubetest"
	"github.com/lanesdev/lanes/kubestore"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// waitOutage waits until the store reports an outage after t.
func waitOutage(t *testing.T, st registry.Outages, after time.Time, what string) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
	for !st.LastOutage().After(after) {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("no outage reported %s", what)
		}
	}
}

// TestOutage: the API server going away is an outage (registry.Outages),
// and so is its return; a registration made from outside any pod is
// shown again once it is back, and nothing registered was lost for good.
func TestOutage(t *testing.T) {
	s := kubetest.Start(t)
	k := newCluster(t, s)
	st := open(t, s, kubestore.Options{Namespaces: []string{k.ns}})
	e := routing.New(routing.WithRegistry(st))
	defer e.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := st.Register(ctx, registry.Instance{Service: "orders", ID: "dev", Addr: "10.0.0.1:80"}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	kubetest.WaitInstances(t, e, "orders", func(in []registry.Instance) bool { return len(in) == 1 })

	down := time.Now()
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	waitOutage(t, st, down, "when the API server stopped")
	up := time.Now()
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	waitOutage(t, st, up, "when the API server came back")
	kubetest.WaitInstances(t, e, "orders", func(in []registry.Instance) bool { return len(in) == 1 && in[0].ID == "dev" })
	if err := l.Err(); err != nil {
		t.Fatalf("the registration ended: %v", err)
	}
}
