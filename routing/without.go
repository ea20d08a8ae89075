package routing

import (
	"math/rand/v2"
	"sync/atomic"
)

// PickWithout is Pick for the retry of a call whose earlier attempts failed
// on the instances with the ids failed: for this pick only, those instances
// count as absent, as if they were not registered. A request stays in its
// lane (and locality level) while that has an eligible instance that has
// not failed the call; once every one has, the request follows the lane
// chain exactly as for a lane with no instance: the lane's fallback lanes in
// order, then the baseline, or lane_unavailable when the chain is strict.
// A baseline request is served by baseline instances only: when every one
// has failed the call, PickWithout fails with no_instance. Canary splits,
// locality and probes follow the usual rules.
//
// A lane request that leaves the lanes it would be served by without
// failed is answered with ReasonFailover. The instances stay in the
// snapshot: the call's outcomes, reported as usual, are what outlier
// detection counts against them.
//
// Unlike Pick, PickWithout walks the groups it considers and may allocate:
// it is the retry's path, not the hot path. Like Pick it never waits: it
// answers from the snapshot in force, and when a time-driven transition is
// due it counts an instance whose ejection has ended as half-open, as the
// next snapshot will, and has an engine goroutine build that one. With no
// failed it is Pick.
func (s *Service) PickWithout(req Request, failed ...string) (Result, error) {
	if len(failed) == 0 {
		return s.Pick(req)
	}
	x := absent(failed)
	sn := s.snap.Load()
	due := s.dueNow(sn)
	var invalid atomic.Uint64 // the call's first pick counted an invalid lane already
	first, l := sn.route(req, &invalid)
	r := first
	lanes := l != "" && !first.split
	if lanes {
		// A lane request: its chain again, with the failed instances out.
		cr := sn.chainRoute(l, x)
		r = &cr
	}
	r, g, probe, l, err := s.eligible(req, r, l, false, due, x)
	switch {
	case err != nil:
		return Result{}, err
	case probe != nil:
		return probeResult(probe, r, l), nil
	}
	reason := r.reason
	if lanes && r.group != first.group && first.err == nil && len(first.group.ready) > 0 {
		// Without the failed instances, the lane (or the fallback) that
		// would have served the request had its ready instances.
		reason = ReasonFailover
	}
	m := x.pick(g)
	return Result{Instance: m.inst, Lane: r.lane, RequestLane: l, Reason: reason, m: m}, nil
}

// absent is the instances that a pick leaves out (PickWithout): the ids of
// those that failed the call it retries. A nil absent leaves none out, and
// its methods are then the group's own answers.
type absent []string

func (x absent) has(m *member) bool {
	for _, id := range x {
		if m.inst.ID == id {
			return true
		}
	}
	return false
}

// some reports whether a member of ms is not in x.
func (x absent) some(ms []*member) bool {
	for _, m := range ms {
		if !x.has(m) {
			return true
		}
	}
	return false
}

// empty is group.empty with the members of x left out. Outside x, an
// ejected member that waits for its ejection to end counts too: when its end
// is due, eligible probes it, as pickSlow does from the snapshot's own
// routes; when it is not, eligible goes on to the route's next.
func (x absent) empty(g *group) bool {
	if len(x) == 0 || g == nil {
		return g.empty()
	}
	return !x.some(g.ready) && !x.some(g.halfOpen) && !x.some(g.waiting)
}

// ready reports whether g has a ready member outside x.
func (x absent) ready(g *group) bool {
	if len(x) == 0 {
		return len(g.ready) > 0
	}
	return x.some(g.ready)
}

// gone reports whether every instance that route r, or the routes after it,
// could send a request to is in x.
func (x absent) gone(r *route) bool {
	if len(x) == 0 {
		return false
	}
	for ; r != nil; r = r.next {
		if r.err == nil && !x.empty(r.group) {
			return false
		}
	}
	return true
}

// pick chooses among the ready members of g outside x by weight: round
// robin on the group's counter when the weights are uniform (no alias
// table), as pickReady does, and a weighted random choice otherwise. g must
// have one (x.ready(g)).
func (x absent) pick(g *group) *member {
	if len(x) == 0 {
		return g.pickReady()
	}
	n, total := 0, 0
	for _, m := range g.ready {
		if !x.has(m) {
			n++
			total += m.weight
		}
	}
	var i int // the member's turn among the n, or its weight's bucket among the total
	if g.alias.prob == nil {
		i = int(g.next.Add(1) % uint64(n))
	} else {
		i = rand.IntN(total)
	}
	var last *member
	for _, m := range g.ready {
		if x.has(m) {
			continue
		}
		w := m.weight
		if g.alias.prob == nil {
			w = 1
		}
		if i < w {
			return m
		}
		i -= w
		last = m
	}
	return last
}
