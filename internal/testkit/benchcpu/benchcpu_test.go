package benchcpu

import (
	"sync/atomic"
	"testing"
)

// TestCompare checks that the comparison runs f and ref n times each, in
// turns, whatever the chunk and the number of callers, and stops the
// benchmark timer around every chunk of ref.
func TestCompare(t *testing.T) {
	for _, par := range []int{0, 1, 3, 8} {
		for _, n := range []int{1, 7, 100} {
			var fs, refs, stops, starts atomic.Int64
			run := serial
			if par > 0 {
				run = parallel(par)
			}
			ref := func() {
				if stops.Load() != starts.Load()+1 {
					t.Errorf("callers %d, n %d: ref ran with the timer on", par, n)
				}
				refs.Add(1)
			}
			compareN(n, 7, func() { fs.Add(1) }, ref, run, func() { stops.Add(1) }, func() { starts.Add(1) })
			if fs.Load() != int64(n) || refs.Load() != int64(n) {
				t.Errorf("callers %d: f ran %d times and ref %d, want %d each", par, fs.Load(), refs.Load(), n)
			}
			if want := int64((n + 6) / 7); stops.Load() != want || starts.Load() != want {
				t.Errorf("callers %d, n %d: timer stopped %d times and started %d, want %d each", par, n, stops.Load(), starts.Load(), want)
			}
		}
	}
}
