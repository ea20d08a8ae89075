package routing

import (
	"context"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

// Known lanes. A lane is known to an engine when the policy in force names
// it (lane settings, fallbacks, canaries, tags) or an instance it knows is
// in it: an instance of a service it routes or, with WithRegistryLanes, of
// any service in the registry. A request in a lane that is not known names
// a lane that exists nowhere (a typo, a lane long gone): its fallback to the
// baseline has its own reason (UnknownLane, for an engine that sees the
// whole registry).
//
// The set is rebuilt whenever what it is made of changes (the policy, the
// lanes of a service's snapshot, the lanes of the registry), off the pick
// path, and published whole: KnownLane is one map lookup. It is bounded by
// the policy and the registry.

// knownLanes is the engine's set of known lanes, immutable once published.
type knownLanes map[string]struct{}

// WithRegistryLanes makes the engine follow the lanes of every instance in
// its registry (one more watch, of every service), so that KnownLane knows
// a lane that has an instance of a service the engine does not route. The
// control plane's gateway uses it; a service's own engine knows the lanes
// of the services it calls, and the policy's.
func WithRegistryLanes() Option { return func(e *Engine) { e.regLanes = true } }

// KnownLane reports whether lane l is known to the engine: named by the
// policy in force, or the lane of an instance the engine knows (see
// WithRegistryLanes). It allocates nothing.
func (e *Engine) KnownLane(l string) bool {
	k := e.known.Load()
	if k == nil {
		return false
	}
	_, ok := (*k)[l]
	return ok
}

// UnknownLane reports whether lane l exists nowhere: the engine follows
// the lanes of the whole registry (WithRegistryLanes), has listed them, and
// neither the policy nor any instance is in l. Without WithRegistryLanes it
// is always false, as the engine does not see every service: a lane without
// an instance of the services it routes may have instances of others. It
// allocates nothing.
func (e *Engine) UnknownLane(l string) bool {
	return e.kn.listed.Load() && !e.KnownLane(l)
}

// known is the engine's state of known lanes.
type known struct {
	mu     sync.Mutex     // orders refreshes
	reg    map[string]int // with WithRegistryLanes: instances in the registry by lane
	listed atomic.Bool    // the registry's lanes were listed once
}

// refreshKnown rebuilds the set of known lanes from the policy in force,
// the snapshots of the services and the registry's lanes, and publishes it.
func (e *Engine) refreshKnown() {
	e.kn.mu.Lock()
	defer e.kn.mu.Unlock()
	set := knownLanes{}
	policyLanes(e.policy.Load().policy, set)
	for l := range e.kn.reg {
		set[l] = struct{}{}
	}
	for _, s := range e.services.All() {
		if sn := s.snap.Load(); sn != nil {
			for _, g := range sn.groups {
				if g.lane != "" {
					set[g.lane] = struct{}{}
				}
			}
		}
	}
	if old := e.known.Load(); old != nil && maps.Equal(*old, set) {
		return
	}
	e.known.Store(&set)
}

// policyLanes adds the lanes that p names to set.
func policyLanes(p *policy.Policy, set knownLanes) {
	if p == nil {
		return
	}
	for l, s := range p.Lanes {
		set[l] = struct{}{}
		for _, f := range s.Fallback {
			set[f] = struct{}{}
		}
	}
	for _, c := range p.Canary {
		set[c.Lane] = struct{}{}
	}
	for _, t := range p.Tags {
		set[t.Lane] = struct{}{}
	}
	delete(set, "")
}

// sameLanes reports whether snapshots a and b have the same lanes (groups,
// in the same order).
func sameLanes(a, b *snapshot) bool {
	if a == nil || b == nil {
		return a == b
	}
	if len(a.groups) != len(b.groups) {
		return false
	}
	for i := range a.groups {
		if a.groups[i].lane != b.groups[i].lane {
			return false
		}
	}
	return true
}

// registryLanes is the stream of the registry watch of WithRegistryLanes:
// it counts the instances of every lane, and refreshes the known lanes
// when a lane appears or goes.
type registryLanes struct {
	w     registry.Watcher
	e     *Engine
	insts map[string]string // service + "\x00" + id -> lane
}

func (s *registryLanes) next(ctx context.Context) error {
	b, err := s.w.Next(ctx)
	if err != nil {
		return err
	}
	e := s.e
	e.kn.mu.Lock()
	before := len(e.kn.reg)
	changed := false
	if b.Reset {
		clear(s.insts)
		clear(e.kn.reg)
		changed = true
	}
	for _, ev := range b.Events {
		key := ev.Instance.Service + "\x00" + ev.Instance.ID
		if l, ok := s.insts[key]; ok {
			delete(s.insts, key)
			if e.kn.reg[l]--; e.kn.reg[l] <= 0 {
				delete(e.kn.reg, l)
				changed = true
			}
		}
		if ev.Type == registry.EventPut && ev.Instance.Lane != "" {
			l := ev.Instance.Lane
			s.insts[key] = l
			if e.kn.reg[l]++; e.kn.reg[l] == 1 {
				changed = true
			}
		}
	}
	changed = changed || len(e.kn.reg) != before
	e.kn.mu.Unlock()
	if changed {
		e.refreshKnown()
	}
	if b.Reset {
		e.kn.listed.Store(true)
	}
	return nil
}

func (s *registryLanes) close() { s.w.Close() }

// watchRegistryLanes is the follower of the lanes of every instance in reg.
func watchRegistryLanes(reg registry.Registry, log *slog.Logger, e *Engine) *follower {
	insts := map[string]string{}
	return &follower{what: "lanes", log: log, open: func(ctx context.Context) (stream, error) {
		w, err := reg.Watch(ctx, "")
		if err != nil {
			return nil, err
		}
		return &registryLanes{w: w, e: e, insts: insts}, nil
	}}
}
