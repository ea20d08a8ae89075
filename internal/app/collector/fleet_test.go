package collector

import (
	"testing"

	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

func TestEngineFleet(t *testing.T) {
	p, err := policy.Parse("policy.yaml", []byte("lanes:\n  team-b: {fallback: [team-a]}\n  locked: {strict: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := routing.New()
	defer e.Close()
	e.SetPolicy(p)
	e.SetInstances("orders", []registry.Instance{
		{Service: "orders", ID: "o-a", Addr: "127.0.0.1:1", Lane: "team-a"},
		{Service: "orders", ID: "o-d", Addr: "127.0.0.1:2", Lane: "drained", Drain: true},
	})
	f := EngineFleet(e, func(s string) bool { return s == "edge" })
	for _, tc := range []struct {
		lane, served string
		want         bool
	}{
		{"team-b", "team-b", true}, {"team-b", "team-a", true}, {"team-b", "", true},
		{"team-b", "bob", false}, {"locked", "", false}, {"", "", true}, {"", "team-a", false},
	} {
		if got := f.Reaches(tc.lane, tc.served); got != tc.want {
			t.Errorf("Reaches(%q, %q) = %v, want %v", tc.lane, tc.served, got, tc.want)
		}
	}
	if !f.LiveInLane("orders", "team-a") || f.LiveInLane("orders", "drained") || f.LiveInLane("orders", "bob") {
		t.Error("LiveInLane: want team-a live, drained and bob not")
	}
	if !f.Entry("edge") || f.Entry("web") {
		t.Error("Entry")
	}
}
