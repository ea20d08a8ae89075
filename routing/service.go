package routing

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lanesdev/lanes/registry"
)

// Service is the routing state of one service: its registered instances, the
// outlier state of each, and the snapshot that picks read.
//
// The snapshot is rebuilt, under mu, by whoever changes what it is built
// from: the registry watcher (instances), SetPolicy (the policy), a caller
// reporting an outcome that ejects or restores an instance. A pick never
// rebuilds and never takes mu: when it claims a probe, or finds a
// time-driven transition due (an ejection ending, a probe given up, a lane
// expiring), it has an engine goroutine rebuild the snapshot (rebuildLater)
// and answers from the snapshot it holds.
//
// With the system clock, a timer also rebuilds the snapshot when its next
// time-driven transition is due (armDue), so that the picks of a service
// with one ahead (a lane with an expiry, an ejection to end) stay on the
// fast path, which reads no clock: such a transition takes effect when
// the timer fires, a fraction of a millisecond late on an idle machine,
// rather than at the first pick after it. With another clock (a
// ManualClock, for virtual time) a pending transition sends every pick of
// the service down the slow path, which reads the clock.
type Service struct {
	e    *Engine
	name string
	snap atomic.Pointer[snapshot]

	mu sync.Mutex // serialises rebuilds; guards insts, det and changed
	// insts are the instances, in id order. Each is immutable once here:
	// snapshots point at them, and a change replaces the pointer, so that a
	// publication copies pointers, not instances.
	insts   []*registry.Instance
	det     detector
	pending atomic.Bool // a rebuild asked by a pick has not started yet
	due     *time.Timer // under mu: rebuilds at the snapshot's due time (armDue)

	ready     chan struct{}
	readyOnce sync.Once
	changed   chan struct{} // closed and replaced by every setInstances
}

func newService(e *Engine, name string) *Service {
	s := &Service{e: e, name: name, ready: make(chan struct{}), changed: make(chan struct{})}
	s.det = detector{svc: s, healths: map[string]*health{}}
	s.rebuild()
	return s
}

// Name returns the service name.
func (s *Service) Name() string { return s.name }

// Ready is closed once the service's instances have been listed from the
// registry (at once for an engine without one).
func (s *Service) Ready() <-chan struct{} { return s.ready }

// WaitReady blocks until Ready, or ctx is done.
func (s *Service) WaitReady(ctx context.Context) error {
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Service) markReady() { s.readyOnce.Do(func() { close(s.ready) }) }

func (s *Service) now() int64 { return s.e.clock.Now().UnixNano() }

// rebuild makes and publishes a new snapshot. s.mu must be held, or the
// service must not be published yet.
func (s *Service) rebuild() {
	sn := build(s.name, s.insts, &s.det, s.e.policy.Load(), s.now(), s.e.timed)
	if old := s.snap.Swap(sn); !sameLanes(old, sn) {
		s.e.refreshKnown()
	}
	if s.e.timed {
		s.armDue(sn.due)
	}
}

// maxDueWait bounds the wait of the due timer: a transition further ahead
// (a lane that expires next year) is waited for in steps of it, each ending
// in a rebuild that arms the timer again.
const maxDueWait = time.Hour

// armDue has the snapshot rebuilt, by an engine goroutine, when its
// time-driven transition is due (due: unix ns; 0 for none). s.mu must be
// held, as for rebuild.
func (s *Service) armDue(due int64) {
	if due == 0 || s.e.g.Context().Err() != nil {
		if s.due != nil {
			s.due.Stop()
		}
		return
	}
	d := min(time.Duration(due-s.now()), maxDueWait)
	if s.due == nil {
		s.due = time.AfterFunc(d, s.rebuildLater)
		return
	}
	s.due.Reset(d)
}

// stopDue stops the due timer, once the engine is closed.
func (s *Service) stopDue() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.due != nil {
		s.due.Stop()
	}
}

// rebuildLater has an engine goroutine rebuild the snapshot, off the pick
// path. At most one such rebuild waits at a time; one asked while another
// runs runs after it, so that no change is missed.
func (s *Service) rebuildLater() {
	if !s.pending.CompareAndSwap(false, true) {
		return
	}
	if !s.e.g.Go(func() {
		s.mu.Lock()
		s.pending.Store(false)
		s.rebuild()
		s.mu.Unlock()
	}) {
		s.pending.Store(false) // the engine is closed
	}
}

// current returns the snapshot, first rebuilding it when a time-driven
// transition is due or a pick asked for a rebuild that has not run yet.
func (s *Service) current() *snapshot {
	sn := s.snap.Load()
	if sn.due != 0 && s.now() >= sn.due || s.pending.Load() {
		s.mu.Lock()
		s.rebuild()
		s.mu.Unlock()
		sn = s.snap.Load()
	}
	return sn
}

// setInstances replaces the instances with a copy of insts.
func (s *Service) setInstances(insts []registry.Instance) {
	own := make([]registry.Instance, len(insts)) // one allocation for every instance
	ptrs := make([]*registry.Instance, len(insts))
	for i, in := range insts {
		own[i] = in.Clone()
		ptrs[i] = &own[i]
	}
	s.replace(ptrs)
}

// replace makes insts, which the caller no longer changes, the instances, in
// id order (once: the groups of every snapshot keep this order). The
// instances they point at must never change.
func (s *Service) replace(insts []*registry.Instance) {
	byID(insts)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.insts = insts
	s.rebuild()
	close(s.changed)
	s.changed = make(chan struct{})
}

// byID puts insts in id order.
func byID(insts []*registry.Instance) {
	cmp := func(a, b *registry.Instance) int { return strings.Compare(a.ID, b.ID) }
	if !slices.IsSortedFunc(insts, cmp) {
		slices.SortFunc(insts, cmp)
	}
}

// Changed returns a channel that is closed at the next change of the
// service's registered instances. Read it before Instances, and wait on it
// after, to miss no change.
func (s *Service) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// Instances returns the registered instances of the service.
func (s *Service) Instances() []registry.Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]registry.Instance, len(s.insts))
	for i, in := range s.insts {
		out[i] = in.Clone()
	}
	return out
}

// Pick routes req to one instance. It fails with an *Error when no instance
// may serve the request. It does not allocate, and does not wait: its answer
// comes from the snapshot in force when it starts.
func (s *Service) Pick(req Request) (res Result, err error) {
	sn := s.snap.Load()
	// The route. A lane found as it came needs no check, as the lanes of
	// the routes are valid names (the transports checked it at the edge).
	r := &sn.baseline
	if l := req.Lane; len(l) > 16 {
		r = sn.lanes.get(l)
	} else if l != "" {
		// sn.lanes.get(l) by hand, as calls would cost a tenth of the
		// pick: laneWords, then the probe.
		var a, b uint64
		switch n := len(l); {
		case n >= 8:
			a, b = le64(l), le64(l[n-8:])
		case n >= 4:
			a, b = le32(l), le32(l[n-4:])
		default:
			a = uint64(l[0])<<16 | uint64(l[n>>1])<<8 | uint64(l[n-1])
		}
		t := &sn.lanes
		for i := t.slot(a, b, len(l)); ; i = (i + 1) & t.mask {
			if e := &t.slots[i]; e.route == nil || e.a == a && e.b == b && len(e.key) == len(l) {
				r = e.route
				break
			}
		}
	} else if sn.canaries != nil {
		r, _ = sn.split(req.Key, r)
	}
	// The fast path: a route whose group answers alone (route.ready).
	var g *group
	if r != nil {
		g = r.ready
	}
	if g == nil {
		res, err = s.pickSlow(req)
		return res, err
	}
	if r.local && (req.Host != "" || req.Zone != "") {
		// The caller's host sub-group found last, else narrow.
		if h := g.hosts.lastOf(req.Host); h != nil {
			g = h
		} else {
			g = g.narrow(req.Zone, req.Host)
		}
	}
	var m *member
	if g.alias.prob == nil {
		m = g.pickRoundRobin()
	} else {
		m = g.pickReady()
	}
	// Field by field, into the named result: a composite literal would be
	// built in a temporary first.
	res.Instance, res.Lane, res.RequestLane, res.Reason, res.m = m.inst, r.lane, r.requestLane, r.reason, m
	return res, nil
}

// pickSlow is the rest of Pick: a lane to check, a canary split, an error,
// a transition due, a probe.
func (s *Service) pickSlow(req Request) (Result, error) {
	sn := s.snap.Load()
	r, l := sn.route(req, &s.e.invalidLanes)
	r, g, probe, l, err := s.eligible(req, r, l, false, s.dueNow(sn), nil)
	switch {
	case err != nil:
		return Result{}, err
	case probe != nil:
		return probeResult(probe, r, l), nil
	}
	m := g.pickReady()
	return Result{Instance: m.inst, Lane: r.lane, RequestLane: l, Reason: r.reason, m: m}, nil
}

// dueNow reports whether the time-driven transition of sn is due, and if
// so has an engine goroutine build the next snapshot (rebuildLater).
func (s *Service) dueNow(sn *snapshot) bool {
	due := sn.due != 0 && s.now() >= sn.due
	if due {
		s.rebuildLater()
	}
	return due
}

// probeResult is the answer of a pick that claimed probe, from route r, for
// a request that carries lane l.
func probeResult(probe *member, r *route, l string) Result {
	return Result{Instance: probe.inst, Lane: r.lane, RequestLane: l, Reason: ReasonProbe, m: probe}
}

// eligible finds the group of instances that may serve req from route r,
// for a request that carries lane l: the route's group, narrowed to the
// caller's host (when the policy says so) or zone. When that group has a
// half-open instance, eligible claims it as this request's probe and returns
// it instead. When every candidate is a half-open instance that other
// requests claimed first, the snapshot being rebuilt will say so; eligible
// gives its answer now, without waiting: the next locality level (host,
// zone, the whole lane), then the rest of the chain (route.next).
//
// When a time-driven transition is due, a waiting member whose ejection has
// ended counts as half-open, as it will in the next snapshot.
//
// A claim is published at once when publish is set (Resolve), and by an
// engine goroutine otherwise (Pick).
//
// The members of x count as absent (PickWithout): a group with none outside
// x is passed over, and a member of x is never claimed as a probe. The
// returned group may still hold members of x, which the pick leaves out.
func (s *Service) eligible(req Request, r *route, l string, publish, due bool, x absent) (*route, *group, *member, string, error) {
	for {
		if r.err != nil {
			return r, nil, nil, l, r.errFor(l)
		}
		var levels [3]*group
		n := 0
		if g := r.group; req.Host != "" && g.hosts != nil {
			if h := g.hosts.get(req.Host); h != nil && (x == nil || !x.empty(h)) {
				levels[n] = h
				n++
			}
		}
		if g := r.group; req.Zone != "" && g.zones != nil {
			if z := g.zones.get(req.Zone); z != nil && (x == nil || !x.empty(z)) {
				levels[n] = z
				n++
			}
		}
		levels[n] = r.group
		n++
		for _, g := range levels[:n] {
			if m := s.claim(g.halfOpen, publish, false, x); m != nil {
				return r, nil, m, l, nil
			}
			if due {
				if m := s.claim(g.waiting, publish, true, x); m != nil {
					return r, nil, m, l, nil
				}
			}
			if x.ready(g) {
				return r, g, nil, l, nil
			}
		}
		if r.split {
			l = "" // the canary takes no share: the request stays a baseline one
		}
		if r.next == nil {
			return r, nil, nil, l, &Error{Code: CodeNoInstance, Service: s.name, Lane: l}
		}
		r = r.next
	}
}

// claim tries to make one of the half-open members ms, other than those of
// x, this request's probe. advance first moves each member's time-driven
// transitions forward.
func (s *Service) claim(ms []*member, publish, advance bool, x absent) *member {
	if len(ms) == 0 {
		return nil
	}
	now, cfg := s.now(), s.snap.Load().outlier
	for _, m := range ms {
		if x.has(m) {
			continue
		}
		if advance {
			if st, _ := m.health.advance(now, cfg); st != stateHalfOpen {
				continue
			}
		}
		if m.health.claimProbe(now, cfg) {
			if publish {
				s.mu.Lock()
				s.rebuild()
				s.mu.Unlock()
			} else {
				s.rebuildLater()
			}
			return m
		}
	}
	return nil
}

// report feeds one outcome to outlier detection, and rebuilds the snapshot
// in the reporting goroutine when it ejects or restores the instance.
func (s *Service) report(h *health, ok bool) {
	if ok && h.state.Load() == stateHealthy {
		return // the common case: no clock, no lock
	}
	if h.report(ok, s.now(), s.snap.Load().outlier) {
		s.mu.Lock()
		s.rebuild()
		s.mu.Unlock()
	}
}

// ReportID feeds the outcome of a call to the instance with the given id to
// outlier detection, as Result.Report does. Unknown ids are ignored.
func (s *Service) ReportID(id string, ok bool) {
	if m := s.snap.Load().member(id); m != nil {
		s.report(m.health, ok)
	}
}

// EjectID ejects the instance with the given id at once, as Result.Eject
// does. Unknown ids are ignored.
func (s *Service) EjectID(id string) {
	if m := s.snap.Load().member(id); m != nil {
		s.eject(m.health)
	}
}

// eject is report for Eject: the failures that eject h, at once.
func (s *Service) eject(h *health) {
	now, cfg := s.now(), s.snap.Load().outlier
	changed := false
	for range cfg.Errors {
		changed = h.report(false, now, cfg) || changed
	}
	if changed {
		s.mu.Lock()
		s.rebuild()
		s.mu.Unlock()
	}
}
