package lanesgrpc_test

import (
	"context"
	"strings"
	"testing"

	"github.com/lanesdev/lanes/registry"
)

// TestDialerRefusesMetadata: NewClient's dialer never connects to a
// link-local or cloud metadata address that an instance was registered
// with: a call in its lane goes to the baseline, and with no other
// instance the call fails naming the rule.
func TestDialerRefusesMetadata(t *testing.T) {
	m := newMesh(t)
	m.start("orders", "base", "")
	lease, err := m.reg.Register(context.Background(), registry.Instance{ID: "meta", Service: "orders", Lane: "alice", Addr: "169.254.169.254:80"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Close()
	waitFor(t, "the engine to list meta", func() bool { return m.listed("orders", "meta") })
	c := m.client("orders")
	for i := range 5 {
		if got := mustServe(t, c, "alice"); !strings.HasPrefix(got, "base") {
			t.Fatalf("call %d in lane alice served by %q, want the baseline", i, got)
		}
	}

	m2 := newMesh(t)
	lease2, err := m2.reg.Register(context.Background(), registry.Instance{ID: "meta", Service: "orders", Addr: "169.254.169.254:80"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lease2.Close()
	waitFor(t, "the engine to list meta", func() bool { return m2.listed("orders", "meta") })
	c2 := m2.client("orders")
	if _, err := servedBy(t, c2, ""); err == nil || !strings.Contains(err.Error(), "link-local") {
		t.Fatalf("call to a metadata instance: %v, want an error naming link-local", err)
	}
}
