package routing

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/registry"
)

// The tests in this file encode the routing contract (docs/routing.md), case
// by case. Conformance cases 01 to 12 also live as scenarios under
// examples/scenarios and run through lanes simulate; 11 and 12 (the
// same-host rule) are in locality_test.go.

func TestConformance01Isolation(t *testing.T) {
	f := newFixture(t, "",
		"b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080",
		"a1 orders 10.0.9.1:8080 lane=alice", "c1 orders 10.0.9.2:8080 lane=carol")
	f.expect("orders", Request{}, []string{"b1", "b2"}, "")
	f.expect("orders", Request{Lane: "alice"}, []string{"a1"}, "alice")
	f.expect("orders", Request{Lane: "bob"}, []string{"b1", "b2"}, "")
	f.expect("orders", Request{Lane: "carol"}, []string{"c1"}, "carol")
}

func TestConformance02BaselineEmpty(t *testing.T) {
	f := newFixture(t, "", "a1 orders 10.0.9.1:8080 lane=alice")
	f.expectErr("orders", Request{}, CodeNoInstance)
	f.expect("orders", Request{Lane: "alice"}, []string{"a1"}, "alice")
	f.expectErr("orders", Request{Lane: "bob"}, CodeNoInstance)
}

func TestConformance03FallbackChain(t *testing.T) {
	f := newFixture(t, "lanes:\n  alice: {fallback: [team-a]}\n",
		"b1 orders 10.0.0.1:8080", "t1 orders 10.0.8.1:8080 lane=team-a",
		"p1 payments 10.0.0.3:8080", "bob1 payments 10.0.9.9:8080 lane=bob")
	d := f.expect("orders", Request{Lane: "alice"}, []string{"t1"}, "team-a")
	if d.Reason != ReasonFallback || d.RequestLane != "alice" {
		t.Fatalf("reason %s, request lane %q; want fallback, alice", d.Reason, d.RequestLane)
	}
	f.expect("payments", Request{Lane: "alice"}, []string{"p1"}, "")
	f.expect("orders", Request{Lane: "team-a"}, []string{"t1"}, "team-a")
}

func TestConformance04Strict(t *testing.T) {
	f := newFixture(t, "lanes:\n  alice: {strict: true}\n",
		"b1 orders 10.0.0.1:8080", "a1 payments 10.0.9.1:8080 lane=alice")
	f.expectErr("orders", Request{Lane: "alice"}, CodeLaneUnavailable)
	f.expect("payments", Request{Lane: "alice"}, []string{"a1"}, "alice")
	f.expect("orders", Request{}, []string{"b1"}, "")
}

func TestConformance05Zone(t *testing.T) {
	f := newFixture(t, "",
		"b1 orders 10.0.0.1:8080 zone=az1", "b2 orders 10.0.0.2:8080 zone=az2",
		"b3 orders 10.0.0.3:8080 zone=az2", "a1 orders 10.0.9.1:8080 lane=alice zone=az2")
	f.expect("orders", Request{Zone: "az2"}, []string{"b2", "b3"}, "")
	f.expect("orders", Request{Zone: "az1"}, []string{"b1"}, "")
	f.expect("orders", Request{Zone: "az3"}, []string{"b1", "b2", "b3"}, "")
	f.expect("orders", Request{}, []string{"b1", "b2", "b3"}, "")
	f.expect("orders", Request{Lane: "alice", Zone: "az1"}, []string{"a1"}, "alice")
}

func TestConformance06WeightZero(t *testing.T) {
	f := newFixture(t, "",
		"b1 orders 10.0.0.1:8080 weight=0", "b2 orders 10.0.0.2:8080",
		"a1 orders 10.0.9.1:8080 lane=alice weight=0")
	f.expect("orders", Request{}, []string{"b2"}, "")
	f.expect("orders", Request{Lane: "alice"}, []string{"b2"}, "")
}

func TestConformance07DynamicTags(t *testing.T) {
	f := newFixture(t, `
tags:
  - {service: orders, lane: gray, addrs: ["10.0.0.3:8080"]}
  - {service: orders, lane: v2, labels: {version: v2}}
`,
		"b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080 label.version=v2",
		"b3 orders 10.0.0.3:8080", "a1 orders 10.0.0.3:9090 lane=alice")
	f.expect("orders", Request{}, []string{"b1"}, "")
	f.expect("orders", Request{Lane: "gray"}, []string{"b3"}, "gray")
	f.expect("orders", Request{Lane: "v2"}, []string{"b2"}, "v2")
	f.expect("orders", Request{Lane: "alice"}, []string{"a1"}, "alice")
}

func TestConformance08LaneNames(t *testing.T) {
	f := newFixture(t, "", "b1 orders 10.0.0.1:8080", "a1 orders 10.0.9.1:8080 lane=alice")
	for _, raw := range []string{" Alice ", "ALICE"} {
		d := f.expect("orders", Request{Lane: raw}, []string{"a1"}, "alice")
		if d.RequestLane != "alice" {
			t.Fatalf("%q travels as %q, want alice", raw, d.RequestLane)
		}
	}
	before := f.e.InvalidLanes()
	for _, raw := range []string{"alice;drop", "al ice", "-alice", "alice-", string(make([]byte, 64))} {
		d := f.expect("orders", Request{Lane: raw}, []string{"b1"}, "")
		if d.Reason != ReasonInvalidLane || d.RequestLane != "" {
			t.Fatalf("%q: reason %s, request lane %q; want invalid-lane and baseline", raw, d.Reason, d.RequestLane)
		}
	}
	f.expect("orders", Request{Lane: ""}, []string{"b1"}, "")
	if got := f.e.InvalidLanes() - before; got != 5 {
		t.Fatalf("counted %d invalid lanes, want 5", got)
	}
}

func TestConformance09Outlier(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 2, window: 30s, ejection: 60s}\n",
		"b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080")
	s := f.e.Service("orders")
	f.at(0)
	f.expect("orders", Request{}, []string{"b1", "b2"}, "")
	f.at(1 * time.Second)
	s.ReportID("b1", false)
	f.at(2 * time.Second)
	f.expect("orders", Request{}, []string{"b1", "b2"}, "")
	f.at(3 * time.Second)
	s.ReportID("b1", false)
	f.at(4 * time.Second)
	f.expect("orders", Request{}, []string{"b2"}, "")
	f.at(64 * time.Second)
	if d := f.expect("orders", Request{}, []string{"b1"}, ""); d.Reason != ReasonProbe {
		t.Fatalf("reason %s, want probe", d.Reason)
	}
	f.expect("orders", Request{}, []string{"b2"}, "")
	f.at(65 * time.Second)
	s.ReportID("b1", true)
	f.at(66 * time.Second)
	f.expect("orders", Request{}, []string{"b1", "b2"}, "")
}

func TestConformance10Canary(t *testing.T) {
	f := newFixture(t, "canary:\n  - {service: orders, lane: canary, percent: 20}\n",
		"b1 orders 10.0.0.1:8080", "k1 orders 10.0.7.1:8080 lane=canary", "a1 orders 10.0.9.1:8080 lane=alice")
	s := f.e.Service("orders")
	canary := 0
	const n = 2000
	for i := range n {
		d, err := s.Resolve(Request{Key: fmt.Sprintf("user-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		if d.Lane == "canary" {
			canary++
			if d.RequestLane != "canary" || d.Reason != ReasonCanary {
				t.Fatalf("canary split travels as %q with reason %s", d.RequestLane, d.Reason)
			}
		}
	}
	if share := float64(canary) * 100 / n; share < 16 || share > 24 {
		t.Fatalf("canary share %.1f%%, want 20±4", share)
	}
	first, _ := s.Resolve(Request{Key: "user-7"})
	for range 200 {
		if d, _ := s.Resolve(Request{Key: "user-7"}); d.Lane != first.Lane {
			t.Fatalf("key user-7 went to %q after %q", d.Lane, first.Lane)
		}
	}
	f.expect("orders", Request{Lane: "alice"}, []string{"a1"}, "alice")
	f.expect("orders", Request{Lane: "canary"}, []string{"k1"}, "canary")
}

// Rules beyond the conformance cases.

func TestStrictLaneInsideChain(t *testing.T) {
	f := newFixture(t, "lanes:\n  alice: {fallback: [team-a, team-b]}\n  team-a: {strict: true}\n",
		"b1 orders 10.0.0.1:8080", "tb orders 10.0.0.2:8080 lane=team-b")
	// team-a is strict, so alice's chain stops at team-a: never team-b, never the baseline.
	f.expectErr("orders", Request{Lane: "alice"}, CodeLaneUnavailable)
	f.expectErr("orders", Request{Lane: "team-a"}, CodeLaneUnavailable)
	f.expect("orders", Request{Lane: "team-b"}, []string{"tb"}, "team-b")
}

func TestFallbackSkipsEmptyLanesAndIsNotTransitive(t *testing.T) {
	f := newFixture(t, "lanes:\n  alice: {fallback: [team-a, team-b]}\n  team-a: {fallback: [team-c]}\n",
		"b1 orders 10.0.0.1:8080", "tb orders 10.0.0.2:8080 lane=team-b", "tc orders 10.0.0.3:8080 lane=team-c")
	f.expect("orders", Request{Lane: "alice"}, []string{"tb"}, "team-b")
	f.expect("orders", Request{Lane: "team-a"}, []string{"tc"}, "team-c")
	g := newFixture(t, "lanes:\n  alice: {fallback: [team-a]}\n  team-a: {fallback: [team-c]}\n",
		"b1 orders 10.0.0.1:8080", "tc orders 10.0.0.3:8080 lane=team-c")
	// alice's chain is alice, team-a, baseline: team-a's own fallbacks are not followed.
	g.expect("orders", Request{Lane: "alice"}, []string{"b1"}, "")
}

func TestLaneNeverReachesAnotherLane(t *testing.T) {
	f := newFixture(t, "", "a1 orders 10.0.9.1:8080 lane=alice", "bob1 orders 10.0.9.2:8080 lane=bob")
	f.expectErr("orders", Request{Lane: "carol"}, CodeNoInstance)
	for range 100 {
		r, err := f.e.Pick("orders", Request{Lane: "alice"})
		if err != nil || r.Instance.ID != "a1" {
			t.Fatalf("alice picked %v, %v", r.Instance, err)
		}
	}
}

func TestZoneInsideFallbackLane(t *testing.T) {
	f := newFixture(t, "lanes:\n  alice: {fallback: [team-a]}\n",
		"b1 orders 10.0.0.1:8080 zone=az1",
		"t1 orders 10.0.8.1:8080 lane=team-a zone=az1", "t2 orders 10.0.8.2:8080 lane=team-a zone=az2")
	f.expect("orders", Request{Lane: "alice", Zone: "az2"}, []string{"t2"}, "team-a")
	f.expect("orders", Request{Lane: "alice", Zone: "az9"}, []string{"t1", "t2"}, "team-a")
}

func TestZoneIgnoresDrainedInstance(t *testing.T) {
	f := newFixture(t, "", "b1 orders 10.0.0.1:8080 zone=az1 weight=0", "b2 orders 10.0.0.2:8080 zone=az2")
	f.expect("orders", Request{Zone: "az1"}, []string{"b2"}, "")
}

func TestDrainedLaneFallsBack(t *testing.T) {
	f := newFixture(t, "", "b1 orders 10.0.0.1:8080", "a1 orders 10.0.9.1:8080 lane=alice weight=0")
	d := f.expect("orders", Request{Lane: "alice"}, []string{"b1"}, "")
	if d.Reason != ReasonLaneEmpty || d.RequestLane != "alice" {
		t.Fatalf("reason %s, request lane %q; want lane-empty, alice (the lane keeps travelling)", d.Reason, d.RequestLane)
	}
}

func TestTagRules(t *testing.T) {
	f := newFixture(t, `
tags:
  - {service: orders, lane: off, addrs: ["10.0.0.1:8080"], enabled: false}
  - {service: orders, lane: first, addrs: ["*:9090"]}
  - {service: orders, lane: second, labels: {track: beta}}
  - {service: payments, lane: other, addrs: ["*:8080"]}
`,
		"b1 orders 10.0.0.1:8080",
		"x1 orders 10.0.0.2:9090 label.track=beta lane=alice",
		"x2 orders 10.0.0.3:8080 label.track=beta")
	f.expect("orders", Request{Lane: "off"}, []string{"b1"}, "")        // disabled rule ignored
	f.expect("orders", Request{Lane: "first"}, []string{"x1"}, "first") // first match wins over registration and later rules
	f.expect("orders", Request{Lane: "second"}, []string{"x2"}, "second")
	f.expect("orders", Request{Lane: "alice"}, []string{"b1"}, "") // x1 no longer counts as alice
	f.expect("orders", Request{}, []string{"b1"}, "")
}

func TestPolicyChangeRebuilds(t *testing.T) {
	f := newFixture(t, "", "b1 orders 10.0.0.1:8080", "t1 orders 10.0.8.1:8080 lane=team-a")
	f.expect("orders", Request{Lane: "alice"}, []string{"b1"}, "")
	f.e.SetPolicy(mustPolicy(t, "lanes:\n  alice: {fallback: [team-a]}\n"))
	f.expect("orders", Request{Lane: "alice"}, []string{"t1"}, "team-a")
	f.e.SetPolicy(nil)
	f.expect("orders", Request{Lane: "alice"}, []string{"b1"}, "")
}

func TestCanaryRules(t *testing.T) {
	// No canary instance: every baseline request stays in the baseline.
	f := newFixture(t, "canary:\n  - {service: orders, lane: canary, percent: 100}\n", "b1 orders 10.0.0.1:8080")
	for i := range 50 {
		f.expect("orders", Request{Key: fmt.Sprint(i)}, []string{"b1"}, "")
	}
	// 100%: every baseline request, keyed or not, goes to the canary; lane requests never do.
	g := newFixture(t, "canary:\n  - {service: orders, lane: canary, percent: 100}\n",
		"b1 orders 10.0.0.1:8080", "k1 orders 10.0.7.1:8080 lane=canary")
	for i := range 50 {
		g.expect("orders", Request{Key: fmt.Sprint(i)}, []string{"k1"}, "canary")
		g.expect("orders", Request{}, []string{"k1"}, "canary")
		g.expect("orders", Request{Lane: "alice"}, []string{"b1"}, "")
	}
	// 0%: never.
	h := newFixture(t, "canary:\n  - {service: orders, lane: canary, percent: 0}\n",
		"b1 orders 10.0.0.1:8080", "k1 orders 10.0.7.1:8080 lane=canary")
	for i := range 50 {
		h.expect("orders", Request{Key: fmt.Sprint(i)}, []string{"b1"}, "")
	}
}

func TestCanaryUnkeyedShare(t *testing.T) {
	f := newFixture(t, "canary:\n  - {service: orders, lane: canary, percent: 30}\n",
		"b1 orders 10.0.0.1:8080", "k1 orders 10.0.7.1:8080 lane=canary")
	n := 0
	for range 4000 {
		if r, _ := f.e.Pick("orders", Request{}); r.Lane == "canary" {
			n++
		}
	}
	if share := float64(n) * 100 / 4000; share < 26 || share > 34 {
		t.Fatalf("unkeyed canary share %.1f%%, want 30±4", share)
	}
}

func TestKeyBucketIsStable(t *testing.T) {
	// The bucket of a key is part of the wire contract between hops and
	// gateway replicas: it must never change between versions.
	for key, want := range map[string]uint64{"user-7": keyBucket("user-7"), "": keyBucket("")} {
		if got := keyBucket(key); got != want || got >= buckets {
			t.Fatalf("bucket(%q) = %d", key, got)
		}
	}
	if keyBucket("user-7") != 7532 {
		t.Fatalf("bucket(user-7) = %d; the canary hash changed", keyBucket("user-7"))
	}
}

func TestOutlierLaneEjectedFollowsChain(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 1, window: 10s, ejection: 30s}\nlanes:\n  alice: {fallback: [team-a]}\n  bob: {strict: true}\n",
		"b1 orders 10.0.0.1:8080", "a1 orders 10.0.9.1:8080 lane=alice",
		"t1 orders 10.0.8.1:8080 lane=team-a", "bob1 orders 10.0.9.2:8080 lane=bob")
	s := f.e.Service("orders")
	s.ReportID("a1", false)
	f.expect("orders", Request{Lane: "alice"}, []string{"t1"}, "team-a")
	s.ReportID("t1", false)
	f.expect("orders", Request{Lane: "alice"}, []string{"b1"}, "")
	s.ReportID("bob1", false)
	f.expectErr("orders", Request{Lane: "bob"}, CodeLaneUnavailable)
	// After the ejection, a1's half-open probe is the next alice request.
	f.at(31 * time.Second)
	f.expect("orders", Request{Lane: "alice"}, []string{"a1"}, "alice")
	// While a1's probe is in flight, alice goes on to team-a (t1 is probing? no: t1 is half-open too).
	d := f.expect("orders", Request{Lane: "alice"}, []string{"t1"}, "team-a")
	if d.Reason != ReasonProbe {
		t.Fatalf("t1 should be probed, reason %s", d.Reason)
	}
	f.expect("orders", Request{Lane: "alice"}, []string{"b1"}, "")
}

func TestOutlierBaselinePanic(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 1, window: 10s, ejection: 30s}\n",
		"b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080", "a1 orders 10.0.9.1:8080 lane=alice")
	s := f.e.Service("orders")
	s.ReportID("b1", false)
	f.expect("orders", Request{}, []string{"b2"}, "")
	s.ReportID("b2", false)
	d := f.expect("orders", Request{}, []string{"b1", "b2"}, "")
	if d.Reason != ReasonPanic {
		t.Fatalf("reason %s, want panic", d.Reason)
	}
	// Panic mode never lends the baseline a lane instance, and lane requests
	// falling back reach the panicking baseline.
	f.expect("orders", Request{Lane: "bob"}, []string{"b1", "b2"}, "")
}

func TestOutlierFailedProbeReejects(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 1, window: 10s, ejection: 30s}\n",
		"b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080")
	s := f.e.Service("orders")
	s.ReportID("b1", false)
	f.at(30 * time.Second)
	f.expect("orders", Request{}, []string{"b1"}, "") // probe
	f.at(31 * time.Second)
	s.ReportID("b1", false)
	f.expect("orders", Request{}, []string{"b2"}, "")
	f.at(60 * time.Second)
	f.expect("orders", Request{}, []string{"b2"}, "") // still ejected: 31s + 30s
	f.at(61 * time.Second)
	f.expect("orders", Request{}, []string{"b1"}, "") // probe again
}

func TestOutlierUnreportedProbeIsRetried(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 1, window: 10s, ejection: 30s}\n",
		"b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080")
	f.e.Service("orders").ReportID("b1", false)
	f.at(30 * time.Second)
	f.expect("orders", Request{}, []string{"b1"}, "") // probe, never reported
	f.expect("orders", Request{}, []string{"b2"}, "")
	f.at(60 * time.Second) // the probe is given up and counts as failed
	f.expect("orders", Request{}, []string{"b2"}, "")
	f.at(90 * time.Second)
	f.expect("orders", Request{}, []string{"b1"}, "")
}

func TestOutlierWindowSlides(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 2, window: 10s, ejection: 30s}\n",
		"b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080")
	s := f.e.Service("orders")
	s.ReportID("b1", false)
	f.at(10 * time.Second)
	s.ReportID("b1", false) // the first failure slid out of the window
	f.expect("orders", Request{}, []string{"b1", "b2"}, "")
	f.at(15 * time.Second)
	s.ReportID("b1", false)
	f.expect("orders", Request{}, []string{"b2"}, "")
	// Outcomes of calls sent before the ejection say nothing; they are ignored.
	s.ReportID("b1", true)
	f.expect("orders", Request{}, []string{"b2"}, "")
}

func TestOutlierDefaults(t *testing.T) {
	f := newFixture(t, "", "b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080")
	s := f.e.Service("orders")
	for range 4 {
		s.ReportID("b1", false)
	}
	f.expect("orders", Request{}, []string{"b1", "b2"}, "")
	s.ReportID("b1", false) // the fifth failure within 30s
	f.expect("orders", Request{}, []string{"b2"}, "")
	f.at(29 * time.Second)
	f.expect("orders", Request{}, []string{"b2"}, "")
	f.at(30 * time.Second)
	f.expect("orders", Request{}, []string{"b1"}, "")
}

func TestOutlierHalfOpenRespectsZone(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 1, window: 10s, ejection: 30s}\n",
		"b1 orders 10.0.0.1:8080 zone=az1", "b2 orders 10.0.0.2:8080 zone=az1", "b3 orders 10.0.0.3:8080 zone=az2")
	f.e.Service("orders").ReportID("b3", false)
	f.at(30 * time.Second)
	f.expect("orders", Request{Zone: "az1"}, []string{"b1", "b2"}, "") // b3 is not in az1's eligible set
	f.expect("orders", Request{Zone: "az2"}, []string{"b3"}, "")       // the probe
}

func TestPickUsesResultReport(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 1, window: 10s, ejection: 30s}\n", "b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080")
	s := f.e.Service("orders")
	r, err := s.Pick(Request{})
	if err != nil {
		t.Fatal(err)
	}
	r.Report(false)
	other := map[string]string{"b1": "b2", "b2": "b1"}[r.Instance.ID]
	for range 10 {
		if p, _ := s.Pick(Request{}); p.Instance.ID != other {
			t.Fatalf("picked %s after ejecting %s", p.Instance.ID, r.Instance.ID)
		}
	}
}

func TestWeightedPickFollowsWeights(t *testing.T) {
	f := newFixture(t, "", "b1 orders 10.0.0.1:8080 weight=100", "b2 orders 10.0.0.2:8080 weight=300")
	counts := map[string]int{}
	const n = 40000
	for range n {
		r, _ := f.e.Pick("orders", Request{})
		counts[r.Instance.ID]++
	}
	if share := float64(counts["b2"]) / n; share < 0.73 || share > 0.77 {
		t.Fatalf("b2 took %.3f of picks, want 0.75 (%v)", share, counts)
	}
}

func TestRoundRobinIsEven(t *testing.T) {
	f := newFixture(t, "", "b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080", "b3 orders 10.0.0.3:8080")
	counts := map[string]int{}
	for range 300 {
		r, _ := f.e.Pick("orders", Request{})
		counts[r.Instance.ID]++
	}
	for id, c := range counts {
		if c != 100 {
			t.Fatalf("%s picked %d times of 300: %v", id, c, counts)
		}
	}
}

func TestErrorMatching(t *testing.T) {
	f := newFixture(t, "", "a1 orders 10.0.9.1:8080 lane=alice")
	_, err := f.e.Pick("orders", Request{})
	if !errors.Is(err, &Error{Code: CodeNoInstance}) || errors.Is(err, &Error{Code: CodeLaneUnavailable}) {
		t.Fatalf("errors.Is does not match codes: %v", err)
	}
	if want := `no_instance: service "orders" has no baseline instance`; err.Error() != want {
		t.Fatalf("message %q, want %q", err, want)
	}
}

func TestErrorNamesTheRequestLane(t *testing.T) {
	f := newFixture(t, "", "a1 orders 10.0.9.1:8080 lane=alice")
	_, err := f.e.Pick("orders", Request{Lane: "bob"})
	var re *Error
	if !errors.As(err, &re) || re.Lane != "bob" || re.Code != CodeNoInstance {
		t.Fatalf("got %#v, want no_instance naming lane bob", err)
	}
	if want := `no_instance: service "orders" has no instance for lane "bob" or its fallbacks`; err.Error() != want {
		t.Fatalf("message %q", err)
	}
}

func TestPanicModeKeepsProbeInFlightOut(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 1, window: 10s, ejection: 30s}\n",
		"b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080")
	s := f.e.Service("orders")
	s.ReportID("b1", false)
	f.at(10 * time.Second)
	s.ReportID("b2", false)
	f.at(30 * time.Second)
	f.expect("orders", Request{}, []string{"b1"}, "") // b1's probe; b2 is still ejected
	d := f.expect("orders", Request{}, []string{"b2"}, "")
	if d.Reason != ReasonPanic {
		t.Fatalf("reason %s, want panic", d.Reason)
	}
}

func TestGivenUpProbeEjectsFromItsDeadline(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 1, window: 10s, ejection: 10s}\n",
		"b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080")
	f.e.Service("orders").ReportID("b1", false)
	f.at(11 * time.Second)
	f.expect("orders", Request{}, []string{"b1"}, "") // probe, never reported; given up at 21s
	f.at(25 * time.Second)
	f.expect("orders", Request{}, []string{"b2"}, "")
	f.at(31 * time.Second) // 21s + 10s, however late the first request after 21s came
	f.expect("orders", Request{}, []string{"b1"}, "")
}

func TestAdmits(t *testing.T) {
	f := newFixture(t, "lanes:\n  alice: {fallback: [team-a]}\ntags:\n  - {service: orders, lane: gray, labels: {track: gray}}\n")
	for _, c := range []struct {
		serving, req string
		want         bool
	}{
		{"", "", true}, {"", "alice", true}, {"", "not valid", true},
		{"alice", "alice", true}, {"alice", " ALICE ", true}, {"alice", "", false}, {"alice", "bob", false},
		{"alice", "al ice", false}, {"team-a", "alice", true}, {"team-a", "team-a", true}, {"alice", "team-a", false},
	} {
		if got := f.e.Admits(c.serving, c.req); got != c.want {
			t.Errorf("Admits(%q, %q) = %v, want %v", c.serving, c.req, got, c.want)
		}
	}
	in := inst(t, "x1 orders 10.0.0.1:80 lane=alice label.track=gray")
	if got := f.e.LaneOf(in); got != "gray" {
		t.Fatalf("LaneOf = %q, want gray (tag rules win over registration)", got)
	}
}

func TestRequestFromContext(t *testing.T) {
	ctx := lane.WithKey(lane.WithLane(context.Background(), "alice"), "user-7")
	if r := RequestFromContext(ctx, "az1", "h1"); r != (Request{Lane: "alice", Zone: "az1", Host: "h1", Key: "user-7"}) {
		t.Fatalf("got %+v", r)
	}
	if n := testing.AllocsPerRun(100, func() { RequestFromContext(ctx, "az1", "h1") }); n != 0 {
		t.Fatalf("allocates %.0f times", n)
	}
}

func TestExpiredLaneTakesNoTraffic(t *testing.T) {
	f := newFixture(t, "lanes:\n  alice: {expires: 2023-11-14T22:15:00Z}\n", // 100s after the fixture's start
		"b1 orders 10.0.0.1:8080", "a1 orders 10.0.9.1:8080 lane=alice")
	f.expect("orders", Request{Lane: "alice"}, []string{"a1"}, "alice")
	f.at(99 * time.Second)
	f.expect("orders", Request{Lane: "alice"}, []string{"a1"}, "alice")
	f.at(100 * time.Second)
	d := f.expect("orders", Request{Lane: "alice"}, []string{"b1"}, "")
	if d.Reason != ReasonLaneEmpty {
		t.Fatalf("reason %s, want lane-empty", d.Reason)
	}
	r, err := f.e.Pick("orders", Request{Lane: "alice"})
	if err != nil || r.Instance.ID != "b1" {
		t.Fatalf("picked %v, %v", r.Instance, err)
	}
}

func TestChangedSignalsInstanceChanges(t *testing.T) {
	f := newFixture(t, "", "b1 orders 10.0.0.1:8080")
	s := f.e.Service("orders")
	ch := s.Changed()
	select {
	case <-ch:
		t.Fatal("Changed closed before any change")
	default:
	}
	f.e.SetInstances("orders", []registry.Instance{inst(t, "b2 orders 10.0.0.2:8080")})
	select {
	case <-ch:
	default:
		t.Fatal("Changed not closed after SetInstances")
	}
	if len(s.Instances()) != 1 || s.Instances()[0].ID != "b2" {
		t.Fatalf("instances %v", s.Instances())
	}
}

func TestPolicyChangedSignals(t *testing.T) {
	f := newFixture(t, "")
	ch := f.e.PolicyChanged()
	f.e.SetPolicy(mustPolicy(t, "lanes:\n  alice: {strict: true}\n"))
	select {
	case <-ch:
	default:
		t.Fatal("PolicyChanged not closed after SetPolicy")
	}
	select {
	case <-f.e.PolicyChanged():
		t.Fatal("the new channel is closed already")
	default:
	}
}

// TestTagRulesHeedScope: a tag rule moves an instance only into a lane the
// credential that registered it may register in (registry.Instance.Scope);
// a rule that may not is passed over for the next one that matches.
func TestTagRulesHeedScope(t *testing.T) {
	f := newFixture(t, "tags:\n  - {service: orders, lane: gray, labels: {version: v2}}\n  - {service: orders, lane: alice, labels: {version: v2}}\n")
	insts := []registry.Instance{
		{ID: "o1", Service: "orders", Addr: "10.0.0.1:8080", Labels: map[string]string{"version": "v2"}},
		{ID: "a1", Service: "orders", Addr: "10.0.9.1:8080", Lane: "alice", Labels: map[string]string{"version": "v2"}, Scope: "alice"},
		{ID: "b1", Service: "orders", Addr: "10.0.0.2:8080", Labels: map[string]string{"version": "v2"}, Scope: registry.ScopeBaseline},
	}
	f.e.SetInstances("orders", insts)
	for in, want := range map[int]string{0: "gray", 1: "alice", 2: ""} {
		if got := f.e.LaneOf(insts[in]); got != want {
			t.Errorf("%s: lane %q, want %q", insts[in].ID, got, want)
		}
	}
	if r := f.e.RefusedTags(insts[1]); len(r) != 1 || r[0].Lane != "gray" {
		t.Errorf("a1's refused rules: %+v, want gray's", r)
	}
	if r := f.e.RefusedTags(insts[2]); len(r) != 2 {
		t.Errorf("b1's refused rules: %+v, want both", r)
	}
	f.expect("orders", Request{Lane: "gray"}, []string{"o1"}, "gray")
	f.expect("orders", Request{Lane: "alice"}, []string{"a1"}, "alice")
	f.expect("orders", Request{}, []string{"b1"}, "")
}
