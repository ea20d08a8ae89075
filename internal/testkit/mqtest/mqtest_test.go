package mqtest

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestLaneOfID(t *testing.T) {
	for id, want := range map[string]string{"base-1": "", "l1-0": "l1", "l3-4999": "l3", "l10-1": ""} {
		if got := laneOfID(id); got != want {
			t.Errorf("laneOfID(%q) = %q, want %q", id, got, want)
		}
	}
}
