package registry

import (
	"sync/atomic"
	"time"
)

// Outages is implemented by a Registry that can tell when it last could not
// reach its store (or was just back from not reaching it). A routing engine
// watching such a registry holds the instances deleted shortly after an
// outage, which are the leases the store expired because it could not be
// reached, not deregistrations (see routing.WithExpiryGrace).
type Outages interface {
	// LastOutage returns when the backend last found its store
	// unreachable, or found it back; zero if never.
	LastOutage() time.Time
}

// OutageClock records the last outage of a backend, for Outages. The zero
// value is ready to use; it is safe for concurrent use.
type OutageClock struct{ last atomic.Int64 }

// Mark records an outage (or the end of one) at t, unless a later one is
// recorded.
func (c *OutageClock) Mark(t time.Time) {
	n := t.UnixNano()
	for {
		old := c.last.Load()
		if old >= n || c.last.CompareAndSwap(old, n) {
			return
		}
	}
}

// Last returns the time of the last outage recorded; zero if none.
func (c *OutageClock) Last() time.Time {
	n := c.last.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
