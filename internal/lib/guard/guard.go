// Package guard is the provider-side check of a lanes instance, written once
// for every transport: an instance registered in a lane refuses the requests
// whose lane chain does not contain its lane (routing.Engine.Admits), so
// that a caller that routes on its own, or a stale one, cannot send baseline
// or foreign-lane traffic to it. laneshttp and lanesgrpc expose it as their
// Guard; each decides which paths or methods are exempt and how a refusal
// is answered.
package guard

import (
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// A Guard checks the requests of one instance against the engine's policy.
//
// A baseline instance admits every request. So does a guard that does not
// know its instance yet: the transports' Serve tell it (SetInstance) before
// the server accepts connections.
//
// A Guard is safe for concurrent use.
type Guard struct {
	e       *routing.Engine
	off     atomic.Bool
	inst    atomic.Pointer[registry.Instance]
	serving atomic.Pointer[servingLane]
	refused atomic.Uint64
}

// servingLane caches the effective lane of the instance under one policy.
type servingLane struct {
	pol  *policy.Policy
	inst *registry.Instance
	lane string
}

// New returns a guard that asks e, which must not be nil.
func New(e *routing.Engine) *Guard {
	if e == nil {
		panic("lanes: a guard with a nil engine")
	}
	return &Guard{e: e}
}

// SetInstance tells the guard which instance it guards, as registered (its
// effective lane follows the policy's tag rules).
func (g *Guard) SetInstance(inst registry.Instance) {
	inst = inst.Clone()
	g.inst.Store(&inst)
}

// SetEnabled turns the guard on (the default) or off. A guard that is off
// admits every request.
func (g *Guard) SetEnabled(on bool) { g.off.Store(!on) }

// Refused returns the number of requests the guard has refused.
func (g *Guard) Refused() uint64 { return g.refused.Load() }

// Admit decides on a request of lane reqLane (as the server read it; "" for
// the baseline). It returns ok when the request may be served; otherwise it
// counts the refusal and returns the lane the instance serves and the
// instance, to name them in the answer. exempt is called, only for a request
// the policy would refuse, to tell whether the request is exempt all the
// same (a health check).
func (g *Guard) Admit(reqLane string, exempt func() bool) (serving string, inst *registry.Instance, ok bool) {
	if g == nil || g.off.Load() {
		return "", nil, true
	}
	serving, inst = g.lane()
	if serving == "" || g.e.Admits(serving, reqLane) || exempt != nil && exempt() {
		return serving, inst, true
	}
	g.refused.Add(1)
	return serving, inst, false
}

// lane returns the effective lane of the guarded instance, "" when unknown.
func (g *Guard) lane() (string, *registry.Instance) {
	inst := g.inst.Load()
	if inst == nil {
		return "", nil
	}
	pol := g.e.Policy() // before LaneOf: a newer policy only makes the cache miss once more
	if s := g.serving.Load(); s != nil && s.pol == pol && s.inst == inst {
		return s.lane, inst
	}
	l := g.e.LaneOf(*inst)
	g.serving.Store(&servingLane{pol: pol, inst: inst, lane: l})
	return l, inst
}

// engines holds the engine that routes on each registry, as lanesenv.Open
// made it (Bind), so that the transports' Serve helpers guard an instance by
// default with the engine of the registry it registers in.
var engines sync.Map // registry.Registry -> *routing.Engine

// Bind records e as the engine of reg, until the returned function is
// called.
func Bind(reg registry.Registry, e *routing.Engine) (unbind func()) {
	if !comparable(reg) || e == nil {
		return func() {}
	}
	engines.Store(reg, e)
	return func() { engines.CompareAndDelete(reg, e) }
}

// For returns a new guard on the engine bound to reg, or nil when none is.
func For(reg registry.Registry) *Guard {
	if !comparable(reg) {
		return nil
	}
	if e, ok := engines.Load(reg); ok {
		return New(e.(*routing.Engine))
	}
	return nil
}

// comparable reports whether reg can be a map key (a registry of a struct
// type holding a slice cannot).
func comparable(reg registry.Registry) bool {
	return reg != nil && reflect.TypeOf(reg).Comparable()
}
