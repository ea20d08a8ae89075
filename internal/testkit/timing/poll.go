package timing

import (
	"testing"
	"time"
)

// Eventually calls f until it returns "" (what the test waits for has
// happened) or within passes, and then fails t with what and f's last
// answer. It is for what no event announces (a process's output, another
// server's state, a watch that catches up on its own): it looks again after
// a millisecond, then less and less often, up to every 50 ms, so that a
// quick condition is seen at once and a slow one costs the machine little.
// Each test package binds it to its own patience.
func Eventually(t testing.TB, what string, within time.Duration, f func() string) {
	t.Helper()
	deadline := time.Now().Add(within)
	pause := time.Millisecond
	for {
		msg := f()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %s", what, within, msg)
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// Until is Eventually for a condition that says only whether it holds.
func Until(t testing.TB, what string, within time.Duration, cond func() bool) {
	t.Helper()
	Eventually(t, what, within, func() string {
		if cond() {
			return ""
		}
		return "it does not hold"
	})
}
