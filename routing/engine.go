// Package routing is the lanes routing engine: given a service, a request lane,
// the caller's zone and a request key, it decides which instances may serve
// the request and picks one. Every transport (gRPC, HTTP, message queues, the
// gateway) and lanes simulate call this one engine, so they all give the
// answers of the routing contract (docs/routing.md).
//
// The state of each service is an immutable snapshot, rebuilt when its
// instances, the policy or an instance's health changes, and published through
// an atomic pointer. A pick is a map lookup in the snapshot plus one atomic
// counter step: it does not allocate and does not grow with the number of
// instances.
//
// An Engine can be fed by hand (SetInstances, SetPolicy) or follow a registry
// and a policy store (WithRegistry, WithPolicyStore); it then owns the
// watching goroutines, and Close stops them.
package routing

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/lanesdev/lanes/lane"
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

	m   *member
	svc *Service
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
	r.svc.report(r.m.health, ok)
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
	log   *slog.Logger
	reg   registry.Registry
	store policy.Store

	policy   atomic.Pointer[compiled]
	services atomic.Pointer[map[string]*Service] // copy on write, under mu

	mu sync.Mutex

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

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
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.policy.Store(compile(nil))
	m := map[string]*Service{}
	e.services.Store(&m)
	if e.store != nil {
		e.wg.Add(1)
		go e.followPolicy()
	} else {
		e.policyOnce.Do(func() { close(e.policyReady) })
	}
	return e
}

// Close stops every watch the engine started and waits for them to end.
func (e *Engine) Close() error {
	e.cancel()
	e.wg.Wait()
	return nil
}

// SetPolicy puts p in force and rebuilds every service. p must be validated
// (policy.Parse does that); a nil p is the empty policy.
func (e *Engine) SetPolicy(p *policy.Policy) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.policy.Store(compile(p))
	for _, s := range *e.services.Load() {
		s.mu.Lock()
		s.rebuild()
		s.mu.Unlock()
	}
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
	m := *e.services.Load()
	out := make([]string, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	return out
}

func (e *Engine) service(name string, watch bool) *Service {
	if s, ok := (*e.services.Load())[name]; ok {
		return s
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	old := *e.services.Load()
	if s, ok := old[name]; ok {
		return s
	}
	s := &Service{e: e, name: name, healths: map[string]*health{}, ready: make(chan struct{}), changed: make(chan struct{})}
	s.rebuild()
	m := make(map[string]*Service, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[name] = s
	e.services.Store(&m)
	if watch && e.reg != nil {
		e.wg.Add(1)
		go s.follow()
	} else {
		s.readyOnce.Do(func() { close(s.ready) })
	}
	return s
}

// Pick routes req to an instance of service. See Service.Pick.
func (e *Engine) Pick(service string, req Request) (Result, error) {
	return e.Service(service).Pick(req)
}

// Service is the routing state of one service.
type Service struct {
	e    *Engine
	name string
	snap atomic.Pointer[snapshot]

	mu      sync.Mutex // serialises rebuilds
	insts   []registry.Instance
	healths map[string]*health

	ready     chan struct{}
	readyOnce sync.Once
	changed   chan struct{} // closed and replaced by every setInstances; guarded by mu
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

func (s *Service) now() int64 { return s.e.clock.Now().UnixNano() }

// rebuild makes and publishes a new snapshot. s.mu must be held, or the
// service must not be published yet.
func (s *Service) rebuild() {
	s.snap.Store(build(s.name, s.insts, s.healths, s.e.policy.Load(), s.now()))
}

func (s *Service) setInstances(insts []registry.Instance) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.insts = make([]registry.Instance, len(insts))
	keep := make(map[string]bool, len(insts))
	for i, in := range insts {
		s.insts[i] = in.Clone()
		keep[in.ID] = true
	}
	for id := range s.healths {
		if !keep[id] {
			delete(s.healths, id)
		}
	}
	s.rebuild()
	close(s.changed)
	s.changed = make(chan struct{})
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
// may serve the request. It does not allocate.
func (s *Service) Pick(req Request) (Result, error) {
	sn, r, lane := s.route(req)
	if r.err == nil {
		// The fast path: no probe is due in the group.
		if g := r.group.narrow(req.Zone, req.Host); len(g.halfOpen) == 0 {
			m := g.pickReady()
			return Result{Instance: &m.inst, Lane: r.lane, RequestLane: lane, Reason: r.reason, m: m, svc: s}, nil
		}
	}
	r, g, probe, lane, err := s.eligible(req, sn, r, lane)
	switch {
	case err != nil:
		return Result{}, err
	case probe != nil:
		return Result{Instance: &probe.inst, Lane: r.lane, RequestLane: lane, Reason: ReasonProbe, m: probe, svc: s}, nil
	}
	m := g.pickReady()
	return Result{Instance: &m.inst, Lane: r.lane, RequestLane: lane, Reason: r.reason, m: m, svc: s}, nil
}

// eligible finds the group of instances that may serve req, given the route
// that s.route found for it: the route's group, narrowed to the caller's
// host (when the policy says so) or zone. When the group has a half-open instance, eligible claims it as this
// request's probe and returns it instead of the group.
func (s *Service) eligible(req Request, sn *snapshot, r *route, lane string) (*route, *group, *member, string, error) {
	for {
		if r.err != nil {
			return r, nil, nil, lane, r.errFor(lane)
		}
		g := r.group.narrow(req.Zone, req.Host)
		if len(g.halfOpen) == 0 {
			return r, g, nil, lane, nil
		}
		if m := s.claim(g); m != nil {
			return r, nil, m, lane, nil
		}
		if len(g.ready) > 0 {
			return r, g, nil, lane, nil
		}
		// Every candidate was claimed by a concurrent probe, and the
		// snapshot that says so is being published: wait for the claimer's
		// rebuild, then route again on it.
		s.mu.Lock()
		s.mu.Unlock() //nolint:staticcheck // only waits for the rebuild
		if s.snap.Load() == sn {
			return r, nil, nil, lane, &Error{Code: CodeNoInstance, Service: s.name, Lane: lane}
		}
		sn, r, lane = s.route(req)
	}
}

// route finds the precomputed route of req in the current snapshot, after
// any due health transition. It returns the request lane to propagate.
func (s *Service) route(req Request) (*snapshot, *route, string) {
	sn := s.snap.Load()
	if sn.due != 0 && s.now() >= sn.due {
		sn = s.advance(sn)
	}
	l := req.Lane
	invalid := false
	if l != "" {
		n, ok := lane.Normalize(l)
		if !ok {
			// An invalid lane is a baseline request in every respect: a
			// canary split applies to it too.
			s.e.invalidLanes.Add(1)
			invalid = true
		}
		l = n
	}
	if l == "" {
		if len(sn.canaries) > 0 {
			var b uint64
			if req.Key != "" {
				b = keyBucket(req.Key)
			} else {
				b = randBucket()
			}
			for i := range sn.canaries {
				if c := &sn.canaries[i]; b >= c.from && b < c.to {
					return sn, c.route, c.lane
				}
			}
		}
		if invalid {
			return sn, &sn.invalid, ""
		}
		return sn, &sn.baseline, ""
	}
	if r, ok := sn.routes[l]; ok {
		return sn, r, l
	}
	return sn, &sn.unknown, l
}

// advance rebuilds the snapshot when a time-driven transition is due.
func (s *Service) advance(sn *snapshot) *snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur := s.snap.Load(); cur != sn {
		return cur // someone else rebuilt it
	}
	s.rebuild()
	return s.snap.Load()
}

// claim tries to make one of g's half-open instances this request's probe.
func (s *Service) claim(g *group) *member {
	for _, m := range g.halfOpen {
		if m.health.claimProbe(s.now(), s.snap.Load().outlier) {
			s.mu.Lock()
			s.rebuild()
			s.mu.Unlock()
			return m
		}
	}
	return nil
}

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
	if m := s.snap.Load().byID[id]; m != nil {
		s.report(m.health, ok)
	}
}

// Decision is the eligible set for one request, as lanes simulate and the
// admin API show it.
type Decision struct {
	Service string
	// RequestLane is the lane that travels downstream ("" for baseline).
	RequestLane string
	// Lane is the serving lane ("" for the baseline).
	Lane   string
	Reason Reason
	// Eligible lists the ids of the instances that may serve the request:
	// one id when the request is a probe.
	Eligible []string
}

// Resolve answers which instances may serve req, without choosing one. Like
// a pick, it sends the probe of a half-open instance, which then stays in
// flight until ReportID reports on it.
func (s *Service) Resolve(req Request) (Decision, error) {
	sn, r, lane := s.route(req)
	r, g, probe, lane, err := s.eligible(req, sn, r, lane)
	d := Decision{Service: s.name, RequestLane: lane}
	switch {
	case err != nil:
		return d, err
	case probe != nil:
		d.Lane, d.Reason, d.Eligible = r.lane, ReasonProbe, []string{probe.inst.ID}
		return d, nil
	}
	d.Lane, d.Reason = r.lane, r.reason
	d.Eligible = append([]string(nil), g.ids...)
	return d, nil
}

// follow watches the service in the registry until the engine closes.
func (s *Service) follow() {
	defer s.e.wg.Done()
	ctx := s.e.ctx
	for ctx.Err() == nil {
		w, err := s.e.reg.Watch(ctx, s.name)
		if err != nil {
			if ctx.Err() == nil {
				s.e.log.Warn("lanes: watch failed; retrying", "service", s.name, "err", err)
				sleep(ctx, retryDelay)
			}
			continue
		}
		var st registry.State
		for {
			b, err := w.Next(ctx)
			if err != nil {
				if ctx.Err() == nil && !errors.Is(err, registry.ErrClosed) {
					s.e.log.Warn("lanes: watch ended; re-watching", "service", s.name, "err", err)
				}
				break
			}
			st.Apply(b)
			s.setInstances(st.Instances(s.name))
			s.readyOnce.Do(func() { close(s.ready) })
		}
		w.Close()
		if errors.Is(ctx.Err(), context.Canceled) {
			return
		}
		sleep(ctx, retryDelay)
	}
}

// followPolicy keeps the engine on the policy in force in the store.
func (e *Engine) followPolicy() {
	defer e.wg.Done()
	for e.ctx.Err() == nil {
		w, err := e.store.Watch(e.ctx)
		if err != nil {
			if e.ctx.Err() == nil {
				e.log.Warn("lanes: policy watch failed; retrying", "err", err)
				sleep(e.ctx, retryDelay)
			}
			continue
		}
		for {
			doc, err := w.Next(e.ctx)
			if err != nil {
				if e.ctx.Err() == nil {
					e.log.Warn("lanes: policy watch ended; re-watching", "err", err)
				}
				break
			}
			e.SetPolicy(doc.Policy)
			e.policyOnce.Do(func() { close(e.policyReady) })
			e.log.Debug("lanes: policy in force", "revision", doc.Revision)
		}
		w.Close()
		sleep(e.ctx, retryDelay)
	}
}

// PolicyReady is closed once the policy in force has been read from the
// store (at once for an engine without one).
func (e *Engine) PolicyReady() <-chan struct{} { return e.policyReady }

// Admits reports whether an instance serving lane serving may take a request
// that carries lane requestLane: the provider-side guard of every transport
// asks it. A baseline instance ("") admits every request, since lane requests
// fall back to the baseline. A lane instance admits only requests whose lane
// chain contains its lane; never a baseline request. requestLane is
// normalised as Pick normalises it; an invalid value is a baseline request.
//
// serving is the instance's effective lane (after dynamic tag rules); see
// Engine.LaneOf.
func (e *Engine) Admits(serving, requestLane string) bool {
	if serving == "" {
		return true
	}
	l, ok := lane.Normalize(requestLane)
	if !ok || l == "" {
		return false
	}
	if l == serving {
		return true
	}
	chain, _ := e.policy.Load().chain(l)
	for _, c := range chain {
		if c == serving {
			return true
		}
	}
	return false
}

// LaneOf returns the effective lane of an instance: the lane of the first
// enabled dynamic tag rule that matches it, or else its registered lane.
func (e *Engine) LaneOf(in registry.Instance) string { return e.policy.Load().laneOf(&in) }
