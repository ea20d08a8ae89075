package routing

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// The same-host rule (locality.host), conformance cases 11 and 12 and its
// edges. The cases also live as scenarios under examples/scenarios.

func TestConformance11SameHost(t *testing.T) {
	f := newFixture(t, "locality: {host: true}\n",
		"b1 orders 10.0.0.1:8080 zone=az1 host=h1", "b2 orders 10.0.0.2:8080 zone=az1 host=h2",
		"b3 orders 10.0.0.3:8080 zone=az2 host=h3", "a1 orders 10.0.9.1:8080 lane=alice zone=az2 host=h3")
	f.expect("orders", Request{Host: "h1", Zone: "az1"}, []string{"b1"}, "")
	f.expect("orders", Request{Host: "h9", Zone: "az1"}, []string{"b1", "b2"}, "")
	f.expect("orders", Request{Host: "h3"}, []string{"b3"}, "")
	f.expect("orders", Request{}, []string{"b1", "b2", "b3"}, "")
	f.expect("orders", Request{Lane: "alice", Host: "h1", Zone: "az1"}, []string{"a1"}, "alice")
}

func TestConformance12SameHostOff(t *testing.T) {
	f := newFixture(t, "",
		"b1 orders 10.0.0.1:8080 zone=az1 host=h1", "b2 orders 10.0.0.2:8080 zone=az1 host=h2")
	f.expect("orders", Request{Host: "h1", Zone: "az1"}, []string{"b1", "b2"}, "")
	f.expect("orders", Request{Host: "h1"}, []string{"b1", "b2"}, "")
	// Written out, false is the default.
	f.e.SetPolicy(mustPolicy(t, "locality: {host: false}\n"))
	f.expect("orders", Request{Host: "h1"}, []string{"b1", "b2"}, "")
}

func TestSameHostPickStaysOnHost(t *testing.T) {
	f := newFixture(t, "locality: {host: true}\n",
		"b1 orders 10.0.0.1:8080 host=h1", "b2 orders 10.0.0.2:8080 host=h1",
		"b3 orders 10.0.0.3:8080 host=h2", "b4 orders 10.0.0.4:8080 host=h2")
	s := f.e.Service("orders")
	seen := map[string]int{}
	for range 100 {
		r, err := s.Pick(Request{Host: "h2"})
		if err != nil {
			t.Fatal(err)
		}
		seen[r.Instance.ID]++
	}
	if len(seen) != 2 || seen["b3"] != 50 || seen["b4"] != 50 {
		t.Fatalf("picks from h2: %v; want b3 and b4, evenly", seen)
	}
}

func TestSameHostBeforeZone(t *testing.T) {
	// The host rule wins over the zone rule, also when the caller's host is
	// in another zone than the caller says (a host sub-group has no zone
	// preference).
	f := newFixture(t, "locality: {host: true}\n",
		"b1 orders 10.0.0.1:8080 zone=az1 host=h1", "b2 orders 10.0.0.2:8080 zone=az2 host=h1",
		"b3 orders 10.0.0.3:8080 zone=az2 host=h2")
	f.expect("orders", Request{Host: "h1", Zone: "az2"}, []string{"b1", "b2"}, "")
	f.expect("orders", Request{Host: "h9", Zone: "az2"}, []string{"b2", "b3"}, "")
	f.expect("orders", Request{Zone: "az2"}, []string{"b2", "b3"}, "")
}

func TestSameHostIgnoresDrained(t *testing.T) {
	f := newFixture(t, "locality: {host: true}\n",
		"b1 orders 10.0.0.1:8080 zone=az1 host=h1 weight=0", "b2 orders 10.0.0.2:8080 zone=az1 host=h2",
		"b3 orders 10.0.0.3:8080 zone=az2 host=h3")
	// h1's only instance is drained: the zone rule decides.
	f.expect("orders", Request{Host: "h1", Zone: "az1"}, []string{"b2"}, "")
	f.expect("orders", Request{Host: "h1"}, []string{"b2", "b3"}, "")
}

func TestSameHostIgnoresEjected(t *testing.T) {
	f := newFixture(t, "locality: {host: true}\noutlier: {errors: 1, ejection: 10s}\n",
		"b1 orders 10.0.0.1:8080 zone=az1 host=h1", "b2 orders 10.0.0.2:8080 zone=az1 host=h1",
		"b3 orders 10.0.0.3:8080 zone=az1 host=h2", "b4 orders 10.0.0.4:8080 zone=az2 host=h3")
	s := f.e.Service("orders")
	f.expect("orders", Request{Host: "h1", Zone: "az1"}, []string{"b1", "b2"}, "")
	s.ReportID("b1", false)
	f.expect("orders", Request{Host: "h1", Zone: "az1"}, []string{"b2"}, "")
	s.ReportID("b2", false)
	// Both of h1's instances are ejected: they do not count as on the host.
	f.expect("orders", Request{Host: "h1", Zone: "az1"}, []string{"b3"}, "")
	f.expect("orders", Request{Host: "h1"}, []string{"b3", "b4"}, "")
	// Once half-open, h1's instances are probed by h1's requests, one each.
	f.at(11 * time.Second)
	d := f.expect("orders", Request{Host: "h1"}, []string{"b1"}, "")
	if d.Reason != ReasonProbe {
		t.Fatalf("reason %s, want probe", d.Reason)
	}
	f.expect("orders", Request{Host: "h1"}, []string{"b2"}, "")
	// Both probes in flight: h1 has no instance that counts.
	f.expect("orders", Request{Host: "h1", Zone: "az1"}, []string{"b3"}, "")
	s.ReportID("b1", true)
	f.expect("orders", Request{Host: "h1", Zone: "az1"}, []string{"b1"}, "")
	// Another host's requests never probe h1's instances.
	f.expect("orders", Request{Host: "h2"}, []string{"b3"}, "")
}

func TestSameHostInsideFallbackLane(t *testing.T) {
	f := newFixture(t, "locality: {host: true}\nlanes:\n  alice: {fallback: [team-a]}\n",
		"b1 orders 10.0.0.1:8080 host=h1", "t1 orders 10.0.8.1:8080 lane=team-a host=h1",
		"t2 orders 10.0.8.2:8080 lane=team-a host=h2")
	// Lane beats host: team-a on h2 is preferred to the baseline on h1, and
	// within team-a the caller's host comes first.
	f.expect("orders", Request{Lane: "alice", Host: "h1"}, []string{"t1"}, "team-a")
	f.expect("orders", Request{Lane: "alice", Host: "h2"}, []string{"t2"}, "team-a")
	f.expect("orders", Request{Lane: "alice", Host: "h3"}, []string{"t1", "t2"}, "team-a")
	// A lane request that falls back to the baseline prefers the host there.
	f.expect("orders", Request{Lane: "bob", Host: "h1"}, []string{"b1"}, "")
}

func TestSameHostStrictLane(t *testing.T) {
	f := newFixture(t, "locality: {host: true}\nlanes:\n  alice: {strict: true}\n",
		"b1 orders 10.0.0.1:8080 host=h1", "a1 orders 10.0.9.1:8080 lane=alice host=h2",
		"p1 payments 10.0.0.3:8080 host=h1")
	f.expect("orders", Request{Lane: "alice", Host: "h1"}, []string{"a1"}, "alice")
	// A strict lane never falls back, not even to an instance on the host.
	f.expectErr("payments", Request{Lane: "alice", Host: "h1"}, CodeLaneUnavailable)
}

func TestSameHostCanary(t *testing.T) {
	f := newFixture(t, "locality: {host: true}\ncanary:\n  - {service: orders, lane: canary, percent: 100}\n",
		"b1 orders 10.0.0.1:8080 host=h1", "k1 orders 10.0.7.1:8080 lane=canary host=h1",
		"k2 orders 10.0.7.2:8080 lane=canary host=h2")
	// The split comes first (it picks the lane), then the host inside it.
	d := f.expect("orders", Request{Key: "user-1", Host: "h2"}, []string{"k2"}, "canary")
	if d.Reason != ReasonCanary || d.RequestLane != "canary" {
		t.Fatalf("reason %s, request lane %q; want canary, canary", d.Reason, d.RequestLane)
	}
	f.expect("orders", Request{Key: "user-1", Host: "h3"}, []string{"k1", "k2"}, "canary")
}

func TestSameHostPanicMode(t *testing.T) {
	f := newFixture(t, "locality: {host: true}\noutlier: {errors: 1, ejection: 10s}\n",
		"b1 orders 10.0.0.1:8080 host=h1", "b2 orders 10.0.0.2:8080 host=h2")
	s := f.e.Service("orders")
	s.ReportID("b1", false)
	f.expect("orders", Request{Host: "h1"}, []string{"b2"}, "")
	s.ReportID("b2", false)
	// Every baseline instance is ejected: all are eligible again, as if
	// healthy, and the host rule applies among them.
	d := f.expect("orders", Request{Host: "h1"}, []string{"b1"}, "")
	if d.Reason != ReasonPanic {
		t.Fatalf("reason %s, want panic", d.Reason)
	}
	f.expect("orders", Request{Host: "h3"}, []string{"b1", "b2"}, "")
}

func TestSameHostFollowsTagRules(t *testing.T) {
	f := newFixture(t, "locality: {host: true}\ntags:\n  - {service: orders, lane: gray, addrs: [\"10.0.0.1:8080\"]}\n",
		"b1 orders 10.0.0.1:8080 host=h1", "b2 orders 10.0.0.2:8080 host=h2")
	// b1 is in lane gray by the tag rule: it is not a baseline instance on
	// h1, so baseline requests from h1 go to b2.
	f.expect("orders", Request{Host: "h1"}, []string{"b2"}, "")
	f.expect("orders", Request{Lane: "gray", Host: "h2"}, []string{"b1"}, "gray")
}

func TestSameHostPolicyChange(t *testing.T) {
	f := newFixture(t, "",
		"b1 orders 10.0.0.1:8080 host=h1", "b2 orders 10.0.0.2:8080 host=h2")
	f.expect("orders", Request{Host: "h1"}, []string{"b1", "b2"}, "")
	f.e.SetPolicy(mustPolicy(t, "locality: {host: true}\n"))
	f.expect("orders", Request{Host: "h1"}, []string{"b1"}, "")
	f.e.SetPolicy(mustPolicy(t, "locality: {host: false}\n"))
	f.expect("orders", Request{Host: "h1"}, []string{"b1", "b2"}, "")
}

func TestInvalidLaneIsSplitByCanary(t *testing.T) {
	f := newFixture(t, "canary:\n  - {service: orders, lane: canary, percent: 100}\n",
		"b1 orders 10.0.0.1:8080", "k1 orders 10.0.7.1:8080 lane=canary")
	before := f.e.InvalidLanes()
	d := f.expect("orders", Request{Lane: "not valid", Key: "user-1"}, []string{"k1"}, "canary")
	if d.Reason != ReasonCanary || d.RequestLane != "canary" {
		t.Fatalf("reason %s, request lane %q; want canary, canary", d.Reason, d.RequestLane)
	}
	if got := f.e.InvalidLanes() - before; got != 1 {
		t.Fatalf("counted %d invalid lanes, want 1", got)
	}
	f.e.SetPolicy(mustPolicy(t, "canary:\n  - {service: orders, lane: canary, percent: 0}\n"))
	d = f.expect("orders", Request{Lane: "not valid", Key: "user-1"}, []string{"b1"}, "")
	if d.Reason != ReasonInvalidLane {
		t.Fatalf("reason %s, want invalid-lane", d.Reason)
	}
}

func TestSameHostPickDoesNotAllocate(t *testing.T) {
	e := fleet(t, 1000, 100)
	e.SetPolicy(mustPolicy(t, "locality: {host: true}\nlanes:\n  ghost: {fallback: [lane-0]}\n"))
	svc := e.Service("orders")
	for _, req := range []Request{
		{Host: "h1"}, {Host: "h9999"}, {Lane: "lane-0", Host: "h501"}, {Lane: "ghost", Host: "h500", Zone: "az1"},
		{Lane: "not valid", Host: "h1"},
	} {
		if n := testing.AllocsPerRun(1000, func() { svc.Pick(req) }); n != 0 {
			t.Errorf("Pick(%+v) allocates %.1f times", req, n)
		}
	}
	r, err := svc.Pick(Request{Host: "h7"})
	if err != nil || r.Instance.Host != "h7" {
		t.Fatalf("picked %+v, %v; want the instance on h7", r.Instance, err)
	}
	r, err = svc.Pick(Request{Lane: "lane-0", Host: fmt.Sprintf("h%d", 500)})
	if err != nil || r.Instance.Host != "h500" || r.Lane != "lane-0" {
		t.Fatalf("picked %+v in %q, %v; want lane-0's instance on h500", r.Instance, r.Lane, err)
	}
}

// TestZoneOneZoneAndZoneless is the zone rule when the serving lane's
// instances have one zone among them and some have none: the caller's zone
// still narrows the set, whatever the order of the instances' ids, in the
// baseline, in a lane, and where the host rule gives way to the zone.
func TestZoneOneZoneAndZoneless(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy string
		insts  []string
		req    Request
		want   []string
		lane   string
	}{
		{"baseline, zoneless first", "", []string{"i3 orders 10.0.0.3:8080", "i4 orders 10.0.0.4:8080 zone=az1"},
			Request{Zone: "az1"}, []string{"i4"}, ""},
		{"baseline, zoneless last", "", []string{"i3 orders 10.0.0.3:8080 zone=az1", "i4 orders 10.0.0.4:8080"},
			Request{Zone: "az1"}, []string{"i3"}, ""},
		{"baseline, another zone", "", []string{"i3 orders 10.0.0.3:8080", "i4 orders 10.0.0.4:8080 zone=az1"},
			Request{Zone: "az2"}, []string{"i3", "i4"}, ""},
		{"lane", "", []string{"b1 orders 10.0.0.1:8080 zone=az1", "a1 orders 10.0.9.1:8080 lane=alice",
			"a2 orders 10.0.9.2:8080 lane=alice zone=az1", "a3 orders 10.0.9.3:8080 lane=alice"},
			Request{Lane: "alice", Zone: "az1"}, []string{"a2"}, "alice"},
		{"fallback lane", "lanes:\n  alice: {fallback: [team-a]}\n", []string{"b1 orders 10.0.0.1:8080 zone=az1",
			"t1 orders 10.0.8.1:8080 lane=team-a", "t2 orders 10.0.8.2:8080 lane=team-a zone=az1"},
			Request{Lane: "alice", Zone: "az1"}, []string{"t2"}, "team-a"},
		{"host rule gives way to the zone", "locality: {host: true}\n", []string{"i1 orders 10.0.0.1:8080 host=h1",
			"i2 orders 10.0.0.2:8080 zone=az1 host=h2"},
			Request{Zone: "az1", Host: "h9"}, []string{"i2"}, ""},
		{"host sub-group has no zone preference", "locality: {host: true}\n", []string{"i1 orders 10.0.0.1:8080 host=h1",
			"i2 orders 10.0.0.2:8080 zone=az1 host=h1", "i3 orders 10.0.0.3:8080 zone=az1 host=h2"},
			Request{Zone: "az1", Host: "h1"}, []string{"i1", "i2"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.policy, tc.insts...)
			f.expect("orders", tc.req, tc.want, tc.lane)
			// The pick's fast path narrows the same way.
			s := f.e.Service("orders")
			for range 20 {
				r, err := s.Pick(tc.req)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Contains(tc.want, r.Instance.ID) {
					t.Fatalf("Pick(%+v) = %s, want one of %v", tc.req, r.Instance.ID, tc.want)
				}
			}
		})
	}
}
