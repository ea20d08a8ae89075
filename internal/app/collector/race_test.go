//go:build race

package collector

// raceEnabled reports whether the race detector is on: TestSpanFlood sends less under it.
const raceEnabled = true
