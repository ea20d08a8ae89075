package mqlane_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/lib/mqlane"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesamqp"
	"github.com/lanesdev/lanes/laneskafka"
	"github.com/lanesdev/lanes/lanesnats"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestLabels: every backend registers its consumers with the same labels.
func TestLabels(t *testing.T) {
	for _, got := range [][3]string{
		{lanesnats.LabelService, lanesnats.LabelGroup, lanesnats.LabelTopic},
		{laneskafka.LabelService, laneskafka.LabelGroup, laneskafka.LabelTopic},
		{lanesamqp.LabelService, lanesamqp.LabelGroup, lanesamqp.LabelTopic},
	} {
		if want := [3]string{mqlane.LabelService, mqlane.LabelGroup, mqlane.LabelTopic}; got != want {
			t.Errorf("labels %q, want %q", got, want)
		}
	}
}

func TestStamp(t *testing.T) {
	if h := mqlane.Stamp(lane.Propagator{}, "", nil); h != nil {
		t.Errorf("baseline without headers: %v, want nil", h)
	}
	h := mqlane.Stamp(lane.Propagator{}, "alice", nil)
	if h[lane.Header][0] != "alice" || h[lane.BaggageHeader][0] != "lane=alice" {
		t.Errorf("lane alice: %v", h)
	}
	// A baseline message loses stale lane headers, keeps the others.
	h = mqlane.Stamp(lane.Propagator{}, "", map[string][]string{lane.Header: {"bob"}, "k": {"v"}})
	if lane.MessageHeader(h).Get(lane.Header) != "" || h["k"][0] != "v" {
		t.Errorf("baseline with stale lane: %v", h)
	}
}
