// Package timing scales the time bounds of tests to the machine they run
// on. A bound that a live peer must meet (a response-header or write
// timeout that a healthy instance answers well within) holds alone on an
// idle machine, but not always in the whole suite under the race detector
// on a loaded 2-core machine, where a process can get no CPU for most of a
// second. Such a bound is written as Bound(d): d, times Factor when the
// race detector is on. A bound that a test waits to fire (a paused peer's
// timeout) costs that much more time under -race, and no more otherwise.
package timing

import (
	"flag"
	"strconv"
	"time"
)

// Factor is how much longer a bound is under the race detector, which
// slows a program by 2 to 10 times: 3, or 1 without it.
const Factor = raceFactor

// Bound is d scaled by Factor.
func Bound(d time.Duration) time.Duration { return d * Factor }

// WaitingTests lets n of a package's parallel tests run at once (go test's
// -parallel), unless the command line chose: for a TestMain whose
// parallel tests spend their time waiting (for leases to run out, for an
// election, for a paused process) rather than computing, so that the
// default of one per CPU would leave the machine idle while they wait.
// It parses the command line, as testing.M.Run would.
func WaitingTests(n int) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		flag.Set("test.parallel", strconv.Itoa(n))
	}
}
