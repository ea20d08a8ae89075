package routing

import (
	"testing"
	"time"
)

// A rebuild's cost, for coalescing, is its wall time capped at twice the
// last cost: one preempted rebuild counts for little, a dearer service is
// followed by doubling.
func TestRebuildCost(t *testing.T) {
	for _, c := range []struct{ took, last, want time.Duration }{
		{10 * time.Microsecond, 0, 10 * time.Microsecond},
		{20 * time.Millisecond, 0, 2 * firstCost},                             // the first list, on a busy process
		{20 * time.Millisecond, 10 * time.Microsecond, 20 * time.Microsecond}, // preempted
		{5 * time.Microsecond, 10 * time.Millisecond, 5 * time.Microsecond},   // cheaper at once
		{5 * time.Millisecond, 4 * time.Millisecond, 5 * time.Millisecond},
	} {
		if got := rebuildCost(c.took, c.last); got != c.want {
			t.Errorf("rebuildCost(%v, %v) = %v, want %v", c.took, c.last, got, c.want)
		}
	}
	// From the first cost to a rebuild of 5 ms: a dozen rebuilds.
	n, d := 0, time.Duration(0)
	for d < 5*time.Millisecond {
		d = rebuildCost(5*time.Millisecond, d)
		n++
	}
	if n > 12 {
		t.Errorf("d caught up with 5 ms after %d rebuilds, want at most 12", n)
	}
}
