package reroute

import (
	"slices"
	"testing"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

func TestChanges(t *testing.T) {
	inst := func(svc, id, lane string) adminapi.Instance {
		return adminapi.Instance{Instance: registry.Instance{Service: svc, ID: id, Addr: "127.0.0.1:1", Lane: lane}, EffectiveLane: lane}
	}
	fleet := []adminapi.Instance{inst("orders", "orders-1", ""), inst("orders", "orders-x", "feature-x"), inst("payments", "payments-1", "")}
	next, err := policy.Parse("next", []byte("lanes:\n  alice:\n    fallback: [feature-x]\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := Changes(nil, next, fleet)
	want := []Change{{Service: "orders", Lane: "alice", Now: "(baseline): orders-1 (lane alice)", Next: "feature-x: orders-x (lane alice)"}}
	if len(got) != 1 || got[0] != want[0] {
		t.Fatalf("Changes = %+v, want %+v", got, want)
	}
	if got := Changes(next, next, fleet); len(got) != 0 {
		t.Errorf("the same policy changes %+v", got)
	}
}

func TestLifetimes(t *testing.T) {
	now, err := policy.Parse("now", []byte("lanes:\n  carol:\n    expires: 2030-01-02T03:04:05Z\n  dave:\n    expires: 2030-01-01T00:00:00Z\n"))
	if err != nil {
		t.Fatal(err)
	}
	next, err := policy.Parse("next", []byte("lanes:\n  dave:\n    expires: 2031-01-01T00:00:00Z\n  erin:\n    strict: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := Lifetimes(now, next)
	want := []Lifetime{
		{Lane: "carol", Now: "2030-01-02T03:04:05Z", Next: "none"},
		{Lane: "dave", Now: "2030-01-01T00:00:00Z", Next: "2031-01-01T00:00:00Z"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Lifetimes = %+v, want %+v", got, want)
	}
	if got := Lifetimes(now, now); len(got) != 0 {
		t.Errorf("the same policy changes lifetimes %+v", got)
	}
}
