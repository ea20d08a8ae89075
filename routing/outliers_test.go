package routing

import (
	"fmt"
	"testing"
	"time"
)

// Outliers shows an ejection with its end, then the instance half-open once
// the ejection is over, then nothing once a probe succeeds.
func TestOutliers(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 2, window: 30s, ejection: 60s}\n",
		"b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080")
	s := f.e.Service("orders")
	f.at(0)
	if o := s.Outliers(); len(o) != 0 {
		t.Fatalf("before any failure: %+v", o)
	}
	f.at(1 * time.Second)
	s.ReportID("b1", false)
	s.ReportID("b1", false)
	got := fmt.Sprint(s.Outliers())
	if want := fmt.Sprint([]Outlier{{ID: "b1", State: "ejected", Until: f.clock.Now().Add(60 * time.Second)}}); got != want {
		t.Fatalf("after two failures: %s, want %s", got, want)
	}
	f.at(62 * time.Second)
	if o := s.Outliers(); len(o) != 1 || o[0].State != "half-open" || !o[0].Until.IsZero() {
		t.Fatalf("after the ejection: %+v, want b1 half-open", o)
	}
	f.expect("orders", Request{}, []string{"b1"}, "") // the probe
	s.ReportID("b1", true)
	if o := s.Outliers(); len(o) != 0 {
		t.Fatalf("after a good probe: %+v", o)
	}
}

// TestLateProbeReportIgnored: a probe not reported within one ejection has
// failed at its deadline; a success reported after it comes from a probe
// given up, and restores nothing, even when no request came in between.
func TestLateProbeReportIgnored(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 1, window: 25s, ejection: 9s}\n", "p1 payments 10.0.1.1:9090")
	s := f.e.Service("payments")
	s.ReportID("p1", false)
	f.at(9 * time.Second)
	if d := f.expect("payments", Request{}, []string{"p1"}, ""); d.Reason != ReasonProbe {
		t.Fatalf("reason %s, want probe", d.Reason)
	}
	// Given up at 18s, and ejected again until 27s: the late success is
	// ignored, and the baseline is in panic mode.
	f.at(19 * time.Second)
	s.ReportID("p1", true)
	if d := f.expect("payments", Request{}, []string{"p1"}, ""); d.Reason != ReasonPanic {
		t.Fatalf("reason %s after a late success, want panic (p1 still ejected)", d.Reason)
	}
	f.at(27 * time.Second)
	if d := f.expect("payments", Request{}, []string{"p1"}, ""); d.Reason != ReasonProbe {
		t.Fatalf("reason %s at the end of the new ejection, want probe", d.Reason)
	}
}

// TestInvalidLaneInPanicMode: an invalid lane is a baseline request in
// every respect, and its answer says panic when the baseline is in panic
// mode, as a lane request's that falls back to it does.
func TestInvalidLaneInPanicMode(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 1, ejection: 10s}\n", "o1 orders 10.0.0.1:8080")
	f.e.Service("orders").ReportID("o1", false)
	for _, req := range []Request{{}, {Lane: "ünï"}, {Lane: "bob"}} {
		if d := f.expect("orders", req, []string{"o1"}, ""); d.Reason != ReasonPanic {
			t.Fatalf("%+v: reason %s, want panic", req, d.Reason)
		}
	}
}

// TestEject: Eject is the policy's errors reported at once: a healthy
// instance leaves at once, whatever the window; an ejected or half-open one
// is left as it is; a probe in flight fails.
func TestEject(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 5, window: 1s, ejection: 10s}\n", "b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080")
	s := f.e.Service("orders")
	r, err := s.Pick(Request{})
	if err != nil {
		t.Fatal(err)
	}
	r.Eject()
	other := map[string]string{"b1": "b2", "b2": "b1"}[r.Instance.ID]
	f.expect("orders", Request{}, []string{other}, "")
	// Ejected: ignored, and the ejection still ends at 10s.
	f.at(5 * time.Second)
	s.EjectID(r.Instance.ID)
	f.at(10 * time.Second)
	if d := f.expect("orders", Request{}, []string{r.Instance.ID}, ""); d.Reason != ReasonProbe {
		t.Fatalf("reason %s at the end of the ejection, want probe", d.Reason)
	}
	// The probe in flight fails: ejected again until 20s.
	s.EjectID(r.Instance.ID)
	f.at(19 * time.Second)
	f.expect("orders", Request{}, []string{other}, "")
	s.EjectID("nosuch") // unknown: ignored
}
