package routing

import (
	"errors"
	"testing"
	"time"
)

// pickWithout picks n times without the failed instances and returns the
// ids picked, failing the test on a pick error or a reason or served lane
// other than wanted.
func (f *fixture) pickWithout(svc string, req Request, failed []string, n int, wantLane string, wantReason Reason) map[string]int {
	f.t.Helper()
	got := map[string]int{}
	for range n {
		r, err := f.e.Service(svc).PickWithout(req, failed...)
		if err != nil {
			f.t.Fatalf("PickWithout(%+v, %v): %v", req, failed, err)
		}
		if r.Lane != wantLane || r.Reason != wantReason || r.RequestLane != req.Lane {
			f.t.Fatalf("PickWithout(%+v, %v): %s in lane %q (reason %s, request lane %q); want lane %q, reason %s, request lane %q",
				req, failed, r.Instance.ID, r.Lane, r.Reason, r.RequestLane, wantLane, wantReason, req.Lane)
		}
		got[r.Instance.ID]++
	}
	return got
}

func (f *fixture) pickWithoutErr(svc string, req Request, failed []string, code Code) {
	f.t.Helper()
	r, err := f.e.Service(svc).PickWithout(req, failed...)
	var re *Error
	if !errors.As(err, &re) || re.Code != code || re.Lane != req.Lane {
		f.t.Fatalf("PickWithout(%+v, %v): %+v, %v; want error %s for lane %q", req, failed, r.Instance, err, code, req.Lane)
	}
}

func only(t *testing.T, got map[string]int, ids ...string) {
	t.Helper()
	for id := range got {
		found := false
		for _, w := range ids {
			found = found || id == w
		}
		if !found {
			t.Fatalf("picked %v; want only %v", got, ids)
		}
	}
	for _, w := range ids {
		if got[w] == 0 {
			t.Fatalf("picked %v; want each of %v", got, ids)
		}
	}
}

func TestPickWithoutFollowsTheChain(t *testing.T) {
	f := newFixture(t, "lanes:\n  alice: {fallback: [team-a]}\n",
		"b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080",
		"a1 orders 10.0.9.1:8080 lane=alice", "a2 orders 10.0.9.2:8080 lane=alice",
		"t1 orders 10.0.8.1:8080 lane=team-a",
		"c1 pay 10.0.1.1:8080", "x1 pay 10.0.1.9:8080 lane=carol")
	alice := Request{Lane: "alice"}

	// Not every instance of the lane failed: the retry stays in it.
	only(t, f.pickWithout("orders", alice, []string{"a1"}, 20, "alice", ReasonLane), "a2")
	// All of them failed: the lane counts as having none, so its fallback serves.
	only(t, f.pickWithout("orders", alice, []string{"a1", "a2"}, 10, "team-a", ReasonFailover), "t1")
	// The fallback lane failed too: the baseline, both of its instances.
	only(t, f.pickWithout("orders", alice, []string{"a2", "t1", "a1"}, 20, "", ReasonFailover), "b1", "b2")
	// The fallback lane failed, alice did not: alice.
	only(t, f.pickWithout("orders", alice, []string{"t1"}, 20, "alice", ReasonLane), "a1", "a2")
	// A lane request that was in the fallback lane already keeps the fallback reason.
	only(t, f.pickWithout("orders", Request{Lane: "team-a"}, []string{"t1"}, 10, "", ReasonFailover), "b1", "b2")
	// Everything failed: no instance is left to try.
	f.pickWithoutErr("orders", alice, []string{"a1", "a2", "t1", "b1", "b2"}, CodeNoInstance)

	// A lane with one instance and no fallback goes to the baseline.
	only(t, f.pickWithout("pay", Request{Lane: "carol"}, []string{"x1"}, 10, "", ReasonFailover), "c1")
	// A lane request already served by the baseline stays there, without the failed one.
	only(t, f.pickWithout("orders", Request{Lane: "bob"}, []string{"b1"}, 10, "", ReasonLaneEmpty), "b2")

	// Only this pick leaves them out: the engine still routes alice to alice.
	f.expect("orders", alice, []string{"a1", "a2"}, "alice")
	// No failed instance: PickWithout is Pick.
	only(t, f.pickWithout("orders", alice, nil, 20, "alice", ReasonLane), "a1", "a2")
}

func TestPickWithoutStrict(t *testing.T) {
	f := newFixture(t, "lanes:\n  alice: {strict: true}\n  dev: {fallback: [alice]}\n",
		"b1 orders 10.0.0.1:8080", "a1 orders 10.0.9.1:8080 lane=alice", "a2 orders 10.0.9.2:8080 lane=alice")
	only(t, f.pickWithout("orders", Request{Lane: "alice"}, []string{"a2"}, 10, "alice", ReasonLane), "a1")
	f.pickWithoutErr("orders", Request{Lane: "alice"}, []string{"a1", "a2"}, CodeLaneUnavailable)
	// A chain that reaches the strict lane stops there too.
	f.pickWithoutErr("orders", Request{Lane: "dev"}, []string{"a1", "a2"}, CodeLaneUnavailable)
}

func TestPickWithoutBaselineNeverReachesALane(t *testing.T) {
	f := newFixture(t, "",
		"b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080", "a1 orders 10.0.9.1:8080 lane=alice")
	only(t, f.pickWithout("orders", Request{}, []string{"b1"}, 10, "", ReasonBaseline), "b2")
	f.pickWithoutErr("orders", Request{}, []string{"b1", "b2"}, CodeNoInstance)
	// An invalid lane is a baseline request in every respect.
	r, err := f.e.Service("orders").PickWithout(Request{Lane: "Not Valid!"}, "b1", "b2")
	if err == nil {
		t.Fatalf("invalid lane: picked %s in lane %q; want no_instance", r.Instance.ID, r.Lane)
	}
	if n := f.e.InvalidLanes(); n != 0 {
		t.Fatalf("the retry counted %d invalid lanes; the call's first pick counts it", n)
	}
}

func TestPickWithoutCanary(t *testing.T) {
	f := newFixture(t, "canary:\n  - {service: orders, lane: canary, percent: 100}\n",
		"b1 orders 10.0.0.1:8080", "k1 orders 10.0.7.1:8080 lane=canary")
	r, err := f.e.Service("orders").PickWithout(Request{Key: "user-1"}, "b1")
	if err != nil || r.Instance.ID != "k1" || r.RequestLane != "canary" || r.Reason != ReasonCanary {
		t.Fatalf("picked %+v, %v; want k1 by the canary split", r, err)
	}
	// The canary's instance failed: the request stays a baseline one.
	only(t, f.pickWithout("orders", Request{Key: "user-1"}, []string{"k1"}, 10, "", ReasonBaseline), "b1")
	f.pickWithoutErr("orders", Request{Key: "user-1"}, []string{"k1", "b1"}, CodeNoInstance)
}

func TestPickWithoutLocality(t *testing.T) {
	f := newFixture(t, "locality: {host: true}\n",
		"b1 orders 10.0.0.1:8080 zone=az1", "b2 orders 10.0.0.2:8080 zone=az2",
		"a1 orders 10.0.9.1:8080 lane=alice zone=az1 host=h1", "a2 orders 10.0.9.2:8080 lane=alice zone=az1 host=h2",
		"a3 orders 10.0.9.3:8080 lane=alice zone=az2 host=h3")
	req := Request{Lane: "alice", Zone: "az1", Host: "h1"}
	// The caller's host failed: its zone, still in the lane.
	only(t, f.pickWithout("orders", req, []string{"a1"}, 10, "alice", ReasonLane), "a2")
	// Its zone failed: the rest of the lane, before the baseline in the caller's zone.
	only(t, f.pickWithout("orders", req, []string{"a1", "a2"}, 10, "alice", ReasonLane), "a3")
	// The lane failed: the baseline, in the caller's zone first.
	only(t, f.pickWithout("orders", req, []string{"a1", "a2", "a3"}, 10, "", ReasonFailover), "b1")
	only(t, f.pickWithout("orders", Request{Zone: "az1"}, []string{"b1"}, 10, "", ReasonBaseline), "b2")
}

func TestPickWithoutWeights(t *testing.T) {
	f := newFixture(t, "",
		"b1 orders 10.0.0.1:8080 weight=100", "b2 orders 10.0.0.2:8080 weight=300", "b3 orders 10.0.0.3:8080 weight=50")
	got := f.pickWithout("orders", Request{}, []string{"b3"}, 4000, "", ReasonBaseline)
	only(t, got, "b1", "b2")
	// By weight: b1 a quarter of the time (1000 expected; 6 standard deviations either side).
	if got["b1"] < 835 || got["b1"] > 1165 {
		t.Fatalf("picked %v; want b1 about 1000 times in 4000", got)
	}
}

func TestPickWithoutProbe(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 1, window: 10s, ejection: 30s}\n",
		"b1 orders 10.0.0.1:8080", "a1 orders 10.0.9.1:8080 lane=alice", "a2 orders 10.0.9.2:8080 lane=alice")
	svc := f.e.Service("orders")
	svc.ReportID("a2", false) // ejected
	f.at(31 * time.Second)    // half-open
	// a1 failed this call; a2's probe is due: the retry sends it.
	r, err := svc.PickWithout(Request{Lane: "alice"}, "a1")
	if err != nil || r.Instance.ID != "a2" || !r.Probe() {
		t.Fatalf("picked %+v, %v; want a2's probe", r, err)
	}
	// The probe is in flight and a1 failed: the baseline.
	only(t, f.pickWithout("orders", Request{Lane: "alice"}, []string{"a1"}, 5, "", ReasonFailover), "b1")
	// A half-open instance that failed this call is not probed by its retry.
	r.Report(false)
	f.at(62 * time.Second)
	only(t, f.pickWithout("orders", Request{Lane: "alice"}, []string{"a1", "a2"}, 5, "", ReasonFailover), "b1")
}

func TestPickWithoutAllocsNothingOnTheHotPath(t *testing.T) {
	svc := fleet(t, 100, 4).Service("orders")
	for _, req := range []Request{{}, {Lane: "lane-0"}, {Zone: "az1"}} {
		if n := testing.AllocsPerRun(1000, func() { svc.PickWithout(req) }); n != 0 {
			t.Errorf("PickWithout(%+v) with no failed instance allocates %.1f times", req, n)
		}
	}
}

// TestWithoutCanaryInvalidLane: a request with an invalid lane that a canary
// split sent to a lane whose instances all failed the call goes on as a
// request with an invalid lane, and says so.
func TestWithoutCanaryInvalidLane(t *testing.T) {
	f := newFixture(t, "canary:\n  - {service: orders, lane: gray, percent: 100}\n",
		"o3 orders 10.0.0.3:9090 lane=gray", "o7 orders 10.0.0.7:8080")
	s := f.e.Service("orders")
	for _, req := range []Request{{Lane: "al_ice", Key: "k14"}, {Key: "k14"}} {
		r, err := s.PickWithout(req, "o3")
		want := ReasonInvalidLane
		if req.Lane == "" {
			want = ReasonBaseline
		}
		if err != nil || r.Instance.ID != "o7" || r.Reason != want || r.RequestLane != "" {
			t.Fatalf("%+v without o3: %+v %v, want o7 carrying no lane (reason %s)", req, r, err, want)
		}
	}
}
