package lanesgrpc

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// DefaultExempt lists the method prefixes a Guard always admits: the gRPC
// health service and server reflection, which infrastructure calls without a
// lane.
var DefaultExempt = []string{
	"/grpc.health.v1.Health/",
	"/grpc.reflection.v1.ServerReflection/",
	"/grpc.reflection.v1alpha.ServerReflection/",
}

// A Guard is the provider-side check of an instance registered in a lane:
// it refuses the requests whose lane chain does not contain the instance's
// lane (routing.Engine.Admits), so that a caller that routes on its own, or
// a stale one, cannot send baseline or foreign-lane traffic to it. Callers
// that route with lanes never send such requests; the guard is defence in
// depth.
//
// A baseline instance admits every request. So does a guard that does not
// know its instance yet: Serve tells it (SetInstance) before the server
// accepts connections.
//
// A Guard is safe for concurrent use.
type Guard struct {
	e       *routing.Engine
	exempt  []string
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

// NewGuard returns a guard that asks e, which must not be nil.
// WithExemptMethods adds method prefixes to DefaultExempt.
func NewGuard(e *routing.Engine, opts ...Option) *Guard {
	if e == nil {
		panic("lanesgrpc: NewGuard with a nil engine")
	}
	c := newConfig(opts)
	g := &Guard{e: e}
	g.exempt = append(append(g.exempt, DefaultExempt...), c.exempt...)
	return g
}

// WithExemptMethods adds full-method prefixes that a Guard admits whatever
// their lane, such as "/my.pkg.Admin/" or "/my.pkg.Orders/Ping", to
// DefaultExempt (read by NewGuard).
func WithExemptMethods(prefixes ...string) Option {
	return func(c *config) { c.exempt = append(c.exempt, prefixes...) }
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

// Check admits or refuses a request for fullMethod whose context carries
// its lane (the server interceptors put it there). It returns nil or a
// FailedPrecondition status naming the lane the instance serves.
func (g *Guard) Check(ctx context.Context, fullMethod string) error {
	if g == nil || g.off.Load() {
		return nil
	}
	serving, inst := g.lane()
	if serving == "" {
		return nil
	}
	reqLane := lane.FromContext(ctx)
	if g.e.Admits(serving, reqLane) {
		return nil
	}
	for _, p := range g.exempt {
		if strings.HasPrefix(fullMethod, p) {
			return nil
		}
	}
	g.refused.Add(1)
	what := "a baseline request"
	if l, ok := lane.Normalize(reqLane); ok && l != "" {
		what = fmt.Sprintf("a request in lane %q, whose chain does not reach it", l)
	}
	return status.Errorf(codes.FailedPrecondition,
		"lanes: instance %q of service %q serves lane %q and does not admit %s", inst.ID, inst.Service, serving, what)
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
