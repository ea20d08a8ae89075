package scenario

import (
	"strings"
	"testing"

	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

// TestFromFleet: a scenario made of a fleet passes under its own policy,
// and fails exactly at the routes another policy changes.
func TestFromFleet(t *testing.T) {
	insts := []registry.Instance{
		{Service: "orders", ID: "o1", Addr: "10.0.0.1:80", Weight: 100},
		{Service: "orders", ID: "o-alice", Addr: "10.0.0.2:80", Lane: "alice", Zone: "az1", Weight: 100},
		{Service: "payments", ID: "p1", Addr: "10.0.0.3:80", Weight: 50},
	}
	raw := []byte("lanes:\n  bob:\n    fallback: [alice]\n  solo:\n    strict: true\n")
	now, err := policy.Parse("", raw)
	if err != nil {
		t.Fatal(err)
	}
	data, err := FromFleet("live", raw, now, insts)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Parse("live.yaml", data)
	if err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	if len(s.Instances) != 3 || len(s.Steps) != 8 { // 2 services x (baseline, alice, bob, solo)
		t.Fatalf("%d instances, %d steps:\n%s", len(s.Instances), len(s.Steps), data)
	}
	if res := Run(s, Options{}); !res.OK() {
		t.Fatalf("the fleet's own scenario fails: %+v\n%s", res.Failures(), data)
	}
	for _, want := range []string{"expect_error: lane_unavailable", "weight: 50", "zone: az1"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("scenario lacks %q:\n%s", want, data)
		}
	}

	// The same expectations under a policy without bob's fallback: only
	// the bob steps fail.
	data, err = FromFleet("live", []byte("lanes:\n  solo:\n    strict: true\n"), now, insts)
	if err != nil {
		t.Fatal(err)
	}
	s, err = Parse("live.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	res := Run(s, Options{})
	fails := res.Failures()
	if len(fails) != 1 || !strings.Contains(fails[0].Message, "o-alice") {
		t.Errorf("failures: %+v", fails)
	}
}
