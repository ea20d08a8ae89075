package lanesmetrics_test

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lanesdev/lanes/lanesmetrics"
)

func TestRequests(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := lanesmetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Observe("orders", "alice", "alice", "none")
	m.Observe("orders", "alice", "alice", "none")
	m.Observe("orders", "bob", "", "no_instance_in_lane")
	for i := range 100 {
		m.Observe("orders", fmt.Sprintf("pr-%d", i), "", "no_instance_in_lane")
	}
	again, err := lanesmetrics.New(reg) // a second transport in the same process
	if err != nil {
		t.Fatal(err)
	}
	again.Observe("orders", "alice", "alice", "none")

	vec, _ := reg.Gather()
	series := 0
	for _, mf := range vec {
		series += len(mf.GetMetric())
	}
	// alice, bob, 30 pr-N lanes with labels of their own, and one "other" series.
	if series != 33 {
		t.Fatalf("%d series, want 33", series)
	}
	want := map[[4]string]float64{
		{"orders", "alice", "alice", "none"}:                              3,
		{"orders", "bob", "baseline", "no_instance_in_lane"}:              1,
		{"orders", "pr-0", "baseline", "no_instance_in_lane"}:             1,
		{"orders", lanesmetrics.Other, "baseline", "no_instance_in_lane"}: 70,
	}
	for l, n := range want {
		c, err := prometheusCounter(reg, l)
		if err != nil || c != n {
			t.Errorf("%v = %v (%v), want %v", l, c, err, n)
		}
	}
	var nilm *lanesmetrics.Requests
	nilm.Observe("x", "", "", "none") // counts nothing, and does not panic
}

func prometheusCounter(reg *prometheus.Registry, l [4]string) (float64, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			if got["service"] == l[0] && got["lane_requested"] == l[1] && got["lane_served"] == l[2] && got["reason"] == l[3] {
				return m.GetCounter().GetValue(), nil
			}
		}
	}
	return 0, fmt.Errorf("no series")
}

func TestObserveAllocs(t *testing.T) {
	m, _ := lanesmetrics.New(prometheus.NewRegistry())
	m.Observe("orders", "alice", "alice", "none")
	if n := testing.AllocsPerRun(1000, func() { m.Observe("orders", "alice", "alice", "none") }); n != 0 {
		t.Fatalf("Observe allocates %v times", n)
	}
}

// TestBound: the first Max values keep their label; the rest are Other, and counted.
func TestBound(t *testing.T) {
	b := lanesmetrics.NewBound(2)
	for v, want := range map[string]string{"a": "a", "b": "b"} {
		if got := b.Label(v); got != want {
			t.Fatalf("Label(%q) = %q", v, got)
		}
	}
	if b.Label("c") != lanesmetrics.Other || b.Label("a") != "a" || b.Label("d") != lanesmetrics.Other || b.Folded() != 2 {
		t.Fatalf("past the bound: folded %d", b.Folded())
	}
}
