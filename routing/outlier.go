package routing

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/lanesdev/lanes/policy"
)

// Health states of an instance under outlier detection.
const (
	stateHealthy  uint32 = iota // eligible
	stateEjected                // out of every eligible set until its ejection ends
	stateHalfOpen               // ejection over: the next request that could reach it probes it
	stateProbing                // a probe is in flight; not eligible for other requests
)

var stateNames = [...]string{"healthy", "ejected", "half-open", "probing"}

// detector is the outlier detector of one service: the health of each of its
// instances, kept across snapshots for as long as the instance stays
// registered. Its map is guarded by the service's mutex (snapshot builds
// read it); each health is safe for concurrent use.
type detector struct {
	svc     *Service // the service whose instances these are
	healths map[string]*health
	gen     uint64 // the build in progress; a health it did not see is forgotten
	seen    int    // healths seen by the build in progress
}

// begin starts a snapshot build, which calls of or keep for each registered
// instance, then end.
func (d *detector) begin() { d.gen++; d.seen = 0 }

// of returns the health of instance id, creating it healthy.
func (d *detector) of(id string) *health {
	h := d.healths[id]
	if h == nil {
		h = &health{svc: d.svc}
		d.healths[id] = h
	}
	if h.gen != d.gen {
		h.gen = d.gen
		d.seen++
	}
	return h
}

// keep keeps the health of a registered instance that the snapshot leaves
// out (a drained one), if it has one.
func (d *detector) keep(id string) {
	if h := d.healths[id]; h != nil && h.gen != d.gen {
		h.gen = d.gen
		d.seen++
	}
}

// end forgets the instances that are no longer registered.
func (d *detector) end() {
	if len(d.healths) == d.seen {
		return
	}
	for id, h := range d.healths {
		if h.gen != d.gen {
			delete(d.healths, id)
		}
	}
}

// health is the outlier-detection state of one instance. It outlives the
// snapshots that point at it, for as long as the instance stays registered.
//
// state is read on the pick path without a lock; every change to it happens
// under mu, except the half-open -> probing claim, which is a CAS.
type health struct {
	state atomic.Uint32
	svc   *Service // the instance's service, which rebuilds its snapshot
	gen   uint64   // the last build that saw the instance; under the service's mutex

	mu       sync.Mutex
	failures []int64 // failure times (ns), oldest first, at most cfg.Errors of them
	until    int64   // ejected: when the ejection ends; probing: when the probe is given up
}

// report records one call outcome at now and reports whether the state
// changed (so the service must rebuild its snapshot).
func (h *health) report(ok bool, now int64, cfg policy.Outlier) bool {
	if ok && h.state.Load() == stateHealthy {
		return false // the common case: no lock
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	// The outcome meets the state as it is now: a probe given up before it
	// came was a failed one, whatever its late report says.
	st, _ := h.advanceLocked(now, cfg)
	switch st {
	case stateHealthy:
		if ok {
			return false
		}
		window := cfg.Window.D().Nanoseconds()
		// Drop failures that slid out of the window, then add this one.
		i := 0
		for i < len(h.failures) && now-h.failures[i] >= window {
			i++
		}
		h.failures = append(h.failures[:0], h.failures[i:]...)
		h.failures = append(h.failures, now)
		if len(h.failures) >= cfg.Errors {
			h.eject(now, cfg)
			return true
		}
		return false
	case stateProbing:
		if ok {
			h.failures = h.failures[:0]
			h.until = 0
			h.state.Store(stateHealthy)
		} else {
			h.eject(now, cfg)
		}
		return true
	}
	// Ejected or half-open: outcomes of calls sent before the ejection say
	// nothing about the probe; ignore them.
	return false
}

// eject must be called with mu held.
func (h *health) eject(now int64, cfg policy.Outlier) {
	h.failures = h.failures[:0]
	h.until = now + cfg.Ejection.D().Nanoseconds()
	h.state.Store(stateEjected)
}

// advance moves time-driven transitions forward to now and returns the state
// and, for ejected or probing instances, the time of the next transition.
//
// A probe that was never reported within one ejection period counts as a
// failed probe, so a caller that died mid-probe cannot strand the instance.
func (h *health) advance(now int64, cfg policy.Outlier) (state uint32, due int64) {
	if st := h.state.Load(); st == stateHealthy || st == stateHalfOpen {
		return st, 0 // no time-driven transition from these: no lock
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.advanceLocked(now, cfg)
}

// advanceLocked is advance with mu held.
func (h *health) advanceLocked(now int64, cfg policy.Outlier) (state uint32, due int64) {
	st := h.state.Load()
	if st == stateProbing && now >= h.until {
		// The probe was given up at h.until: it failed then, however late
		// the next request comes, so the new ejection runs from that moment.
		h.eject(h.until, cfg)
		st = stateEjected
	}
	if st == stateEjected && now >= h.until {
		st = stateHalfOpen
		h.state.Store(st)
	}
	if st == stateEjected || st == stateProbing {
		return st, h.until
	}
	return st, 0
}

// claimProbe turns a half-open instance into a probing one; only one caller
// wins.
func (h *health) claimProbe(now int64, cfg policy.Outlier) bool {
	if !h.state.CompareAndSwap(stateHalfOpen, stateProbing) {
		return false
	}
	h.mu.Lock()
	h.until = now + cfg.Ejection.D().Nanoseconds()
	h.mu.Unlock()
	return true
}

// Clock tells the engine the time. The engine reads it when outlier state
// can change (a failure, a probe) and when it builds a snapshot, never on
// an ordinary pick. With the system clock, a timer rebuilds a snapshot when
// its next time-driven transition (an ejection's end, a lane's expiry) is
// due; with another clock, the picks of a service with such a transition
// pending read the clock (the slow path), since no timer follows it.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// ManualClock is a Clock that moves only when told to. lanes simulate uses it
// for its virtual time. It is safe for concurrent use.
type ManualClock struct{ ns atomic.Int64 }

// NewManualClock returns a clock reading t.
func NewManualClock(t time.Time) *ManualClock {
	c := &ManualClock{}
	c.ns.Store(t.UnixNano())
	return c
}

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// Set moves the clock to t.
func (c *ManualClock) Set(t time.Time) { c.ns.Store(t.UnixNano()) }

// Advance moves the clock forward by d.
func (c *ManualClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }
