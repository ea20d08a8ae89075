//go:build race

package timing

const raceFactor = 3

// Race reports whether the race detector is on.
const Race = true
