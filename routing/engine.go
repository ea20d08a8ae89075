// Package routing is the lanes routing engine: given a service, a request lane,
// the caller's zone and host and a request key, it decides which instances may
// serve the request and picks one. Every transport (gRPC, HTTP, message
// queues, the gateway) and lanes simulate call this one engine, so they all
// give the answers of the routing contract (docs/routing.md).
//
// The state of each service is an immutable snapshot, rebuilt when its
// instances, the policy or an instance's health changes, and published through
// an atomic pointer. A pick is a table lookup in the snapshot plus one atomic
// counter step: it does not allocate, does not grow with the number of
// instances, and never waits for a rebuild.
//
// The engine's jobs are apart, each in a small type: the Engine holds the
// services and the policy in force; a Service holds one service's snapshot
// and picks from it; a follower keeps a service's instances in step with the
// registry (WithRegistry), another the policy with its store
// (WithPolicyStore); a detector keeps the outlier state of a service's
// instances; the compiled policy answers the provider-side guard (Admits);
// Resolve explains a decision. An Engine can also be fed by hand
// (SetInstances, SetPolicy). It owns every goroutine it starts, and Close
// stops them.
package routing

import (
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/lanesdev/lanes/internal/lib/cowmap"
	"github.com/lanesdev/lanes/internal/lib/gogroup"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

// Request is what the engine needs to know about one call.
type Request struct {
	// Lane is the request lane, normalised (see lane.Parse). A value that is
	// not a valid lane name routes as a baseline request.
	Lane string
	// Zone is the caller's zone; "" when unknown.
	Zone string
	// Host is the caller's host (the machine or pod it runs on, as the
	// registry names it: registry.LocalHost); "" when unknown. It matters
	// only when the policy turns on locality.host.
	Host string
	// Key makes canary splits sticky: the same key always gets the same
	// answer. With no key, the split is random.
	Key string
}

// Result is one pick.
type Result struct {
	// Instance is the chosen instance. It points into an immutable snapshot:
	// do not modify it.
	Instance *registry.Instance
	// Lane is the lane of the instance that serves ("" for the baseline).
	Lane string
	// RequestLane is the lane the request carries downstream: the request's
	// lane, or the canary lane it was split to ("" for a baseline request).
	RequestLane string
	// Reason says why the request went where it went.
	Reason Reason

	m *member
}

// Probe reports whether this pick is a half-open probe.
func (r Result) Probe() bool { return r.Reason == ReasonProbe }

// Report feeds the outcome of the call to outlier detection. Call it once per
// pick: ok is false for a failure that says the instance is unhealthy (a
// connection error, an HTTP 5xx, gRPC Unavailable). Reporting success on a
// healthy instance takes no lock.
func (r Result) Report(ok bool) {
	if r.m == nil {
		return
	}
	r.m.health.svc.report(r.m.health, ok)
}

// Eject ejects the instance of r at once, as if it had failed as many calls
// as the policy's outlier detection needs: for an instance that cannot have
// served the call (its connection was refused) or that did not answer it
// within the response-header timeout (it hangs), whatever the call rate.
// Like a failure, it is ignored for an instance already ejected or
// half-open, and it fails a probe in flight.
func (r Result) Eject() {
	if r.m == nil {
		return
	}
	r.m.health.svc.eject(r.m.health)
}

// Option configures an Engine.
type Option func(*Engine)

// WithClock sets the engine's clock (default: the system clock).
func WithClock(c Clock) Option { return func(e *Engine) { e.clock = c } }

// WithLogger sets the logger (default: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(e *Engine) { e.log = l } }

// WithRegistry makes the engine watch each service it is asked about in reg.
func WithRegistry(reg registry.Registry) Option { return func(e *Engine) { e.reg = reg } }

// WithPolicyStore makes the engine follow the policy in force in st.
func WithPolicyStore(st policy.Store) Option { return func(e *Engine) { e.store = st } }

// Engine routes requests to the instances of many services.
type Engine struct {
	clock Clock
	// timed: the clock is the system clock, so that a timer can rebuild a
	// snapshot when its time-driven transition is due (Service.armDue).
	timed bool
	log   *slog.Logger
	reg   registry.Registry
	store policy.Store

	policy   atomic.Pointer[compiled]
	services cowmap.Map[string, *Service] // written under mu too, so that SetPolicy rebuilds every service

	mu sync.Mutex

	g *gogroup.Group // the watches' goroutines; Close cancels and waits

	expiry expiryGuard // tells a mass expiry across the watched services (hold.go)

	// regLanes: follow the lanes of every instance in reg (WithRegistryLanes).
	regLanes bool
	known    atomic.Pointer[knownLanes] // KnownLane's set (known.go)
	kn       known

	invalidLanes  atomic.Uint64
	policyReady   chan struct{}
	policyOnce    sync.Once
	policyChanged chan struct{} // closed and replaced by every SetPolicy; guarded by mu
}

// New returns an engine with the empty policy and no services. When
// WithPolicyStore is given, it starts following the store at once.
func New(opts ...Option) *Engine {
	e := &Engine{clock: systemClock{}, log: slog.Default(), policyReady: make(chan struct{}), policyChanged: make(chan struct{})}
	for _, o := range opts {
		o(e)
	}
	e.g = gogroup.New()
	_, e.timed = e.clock.(systemClock)
	e.policy.Store(compile(nil))
	e.refreshKnown()
	if e.reg != nil && e.regLanes {
		e.kn.reg = map[string]int{}
		f := watchRegistryLanes(e.reg, e.log, e)
		e.g.Go(func() { f.run(e.g.Context()) })
	}
	if e.store != nil {
		f := followPolicy(e.store, e.log, e)
		e.g.Go(func() { f.run(e.g.Context()) })
	} else {
		e.policyOnce.Do(func() { close(e.policyReady) })
	}
	return e
}

// Close stops every watch the engine started and waits for them, and for
// any rebuild in progress, to end.
func (e *Engine) Close() error {
	e.g.Close()
	for _, s := range e.services.All() {
		s.stopDue()
	}
	return nil
}

// SetPolicy puts p in force and rebuilds every service. p must be validated
// (policy.Parse does that); a nil p is the empty policy.
func (e *Engine) SetPolicy(p *policy.Policy) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.policy.Store(compile(p))
	for _, s := range e.services.All() {
		s.mu.Lock()
		s.rebuild()
		s.mu.Unlock()
	}
	e.refreshKnown()
	close(e.policyChanged)
	e.policyChanged = make(chan struct{})
}

// PolicyChanged returns a channel that is closed when the next policy is put
// in force. Read it before Policy, and wait on it after, to miss no change.
func (e *Engine) PolicyChanged() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.policyChanged
}

// Policy returns the policy in force.
func (e *Engine) Policy() *policy.Policy { return e.policy.Load().policy }

// PolicyReady is closed once the policy in force has been read from the
// store (at once for an engine without one).
func (e *Engine) PolicyReady() <-chan struct{} { return e.policyReady }

// InvalidLanes counts the requests that carried an invalid lane and were
// routed as baseline requests.
func (e *Engine) InvalidLanes() uint64 { return e.invalidLanes.Load() }

// SetInstances replaces the instances of service. Instances must be
// normalised (registry.Normalize); the engine keeps its own copy.
func (e *Engine) SetInstances(service string, insts []registry.Instance) {
	s := e.service(service, false)
	s.setInstances(insts)
}

// Service returns the handle of the named service, creating it if needed.
// Transports keep the handle and pick through it, which saves a map lookup.
// With WithRegistry, the first call starts watching the service.
func (e *Engine) Service(name string) *Service { return e.service(name, true) }

// Services returns the names of the services the engine knows.
func (e *Engine) Services() []string {
	out := make([]string, 0, e.services.Len())
	for n := range e.services.All() {
		out = append(out, n)
	}
	return out
}

func (e *Engine) service(name string, watch bool) *Service {
	if s, ok := e.services.Load(name); ok {
		return s
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	s, created := e.services.LoadOrStore(name, func() *Service { return newService(e, name) }, 0)
	if !created {
		return s
	}
	if watch && e.reg != nil {
		f := watchInstances(e.reg, e.log, s)
		e.g.Go(func() { f.run(e.g.Context()) })
	} else {
		s.markReady()
	}
	return s
}

// Pick routes req to an instance of service. See Service.Pick.
func (e *Engine) Pick(service string, req Request) (Result, error) {
	return e.Service(service).Pick(req)
}
