package routing

import (
	"testing"
	"time"

	"github.com/lanesdev/lanes/registry"
)

// dueFleet is an engine on the system clock whose service orders has a
// baseline instance b1 and an instance a1 in lane alice, under policy doc.
func dueFleet(t *testing.T, doc string, opts ...Option) *Service {
	t.Helper()
	e := New(opts...)
	t.Cleanup(func() { e.Close() })
	e.SetPolicy(mustPolicy(t, doc))
	e.SetInstances("orders", []registry.Instance{
		{ID: "b1", Service: "orders", Addr: "10.0.0.1:80"},
		{ID: "a1", Service: "orders", Addr: "10.0.0.2:80", Lane: "alice"},
	})
	return e.Service("orders")
}

// TestDueKeepsFastPath: on the system clock, a time-driven transition ahead
// (a lane that expires in an hour) leaves every route its fast path, and a
// pick allocates nothing; on a ManualClock the pending transition sends the
// picks down the slow path, which reads the clock.
func TestDueKeepsFastPath(t *testing.T) {
	doc := "lanes:\n  alice: {expires: " + time.Now().Add(time.Hour).UTC().Format(time.RFC3339) + "}\n"
	svc := dueFleet(t, doc)
	sn := svc.snap.Load()
	if sn.due == 0 {
		t.Fatal("no transition due: the test needs the lane's expiry")
	}
	if sn.baseline.ready == nil || sn.routes["alice"].ready == nil {
		t.Fatal("a route lost its fast path to a transition an hour ahead")
	}
	for _, req := range []Request{{Lane: "alice"}, {}} {
		if n := testing.AllocsPerRun(200, func() { svc.Pick(req) }); n != 0 {
			t.Errorf("Pick(%+v) allocates %v times", req, n)
		}
	}

	manual := dueFleet(t, doc, WithClock(NewManualClock(time.Now())))
	if sn := manual.snap.Load(); sn.baseline.ready != nil || sn.routes["alice"].ready != nil {
		t.Error("on a ManualClock, a route kept its fast path with a transition pending")
	}
}

// TestLaneExpiresOnTime: on the system clock, a lane stops taking requests
// when it expires although its picks stay on the fast path (which reads no
// clock): the due timer rebuilds the snapshot. Without it, the lane would
// take requests until something else rebuilt the snapshot.
func TestLaneExpiresOnTime(t *testing.T) {
	exp := time.Now().Add(500 * time.Millisecond)
	svc := dueFleet(t, "lanes:\n  alice: {expires: "+exp.UTC().Format(time.RFC3339Nano)+"}\n")
	// The bound is generous for a loaded machine; the timer fires within
	// a millisecond on an idle one.
	deadline := exp.Add(3 * time.Second)
	for {
		r, err := svc.Pick(Request{Lane: "alice"})
		now := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		if r.Lane != "alice" {
			if now.Before(exp) {
				t.Fatalf("lane alice left at %v, before its expiry at %v", now, exp)
			}
			t.Logf("lane alice left %v after its expiry", now.Sub(exp))
			if r.Instance.ID != "b1" {
				t.Fatalf("served by %s after the expiry, want the baseline's b1", r.Instance.ID)
			}
			return
		}
		if now.After(deadline) {
			t.Fatalf("lane alice still served %v after its expiry", now.Sub(exp))
		}
		time.Sleep(time.Millisecond)
	}
}

// TestEjectionEndsOnTime: on the system clock, an ejected instance is
// probed once its ejection has ended, although the picks meanwhile take
// the fast path (to a2, the lane's other instance): the due timer rebuilds
// the snapshot with it half-open.
func TestEjectionEndsOnTime(t *testing.T) {
	svc := dueFleet(t, "outlier: {errors: 1, window: 1m, ejection: 300ms}\n")
	svc.e.SetInstances("orders", []registry.Instance{
		{ID: "b1", Service: "orders", Addr: "10.0.0.1:80"},
		{ID: "a1", Service: "orders", Addr: "10.0.0.2:80", Lane: "alice"},
		{ID: "a2", Service: "orders", Addr: "10.0.0.3:80", Lane: "alice"},
	})
	var r Result
	for r.Instance == nil || r.Instance.ID != "a1" {
		var err error
		if r, err = svc.Pick(Request{Lane: "alice"}); err != nil {
			t.Fatal(err)
		}
	}
	// The ejection begins inside Report, at the engine clock's reading
	// there: no earlier than before, no later than ejected. The probe may
	// come no sooner than 300ms after before (a bound from ejected would
	// fail whenever Report itself, which rebuilds the snapshot, took
	// longer than the due timer's delay: 1.4ms under -race on a loaded
	// machine); the deadline counts from ejected.
	before := time.Now()
	r.Report(false)
	ejected := time.Now()
	if sn := svc.snap.Load(); sn.routes["alice"].ready == nil {
		t.Fatal("alice's route lost its fast path while a1 is ejected and a2 ready")
	}
	deadline := ejected.Add(300*time.Millisecond + 3*time.Second)
	for {
		r, err := svc.Pick(Request{Lane: "alice"})
		now := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		if r.Instance.ID == "a1" {
			if now.Sub(before) < 300*time.Millisecond {
				t.Fatalf("a1 picked %v after its ejection of 300ms began (Report took %v)", now.Sub(before), ejected.Sub(before))
			}
			if !r.Probe() {
				t.Fatalf("a1 picked after its ejection as %v, want a probe", r.Reason)
			}
			t.Logf("a1 probed %v after its ejection began", now.Sub(ejected))
			return
		}
		if now.After(deadline) {
			t.Fatalf("a1 not probed %v after its ejection began (300ms)", now.Sub(ejected))
		}
		time.Sleep(time.Millisecond)
	}
}
