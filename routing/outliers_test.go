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
