package lanesgrpc

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "google.golang.org/grpc/health" // the client-side health check of WithHealthCheck
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"

	"github.com/lanesdev/lanes/lanesmetrics"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// Scheme is the URI scheme of lanes targets: "lanes:///orders" names the
// service "orders".
const Scheme = "lanes"

// NewBuilder returns a resolver.Builder for "lanes:///<service>" targets that
// feeds gRPC the instances of the service as the routing engine e sees them.
// Register it for one ClientConn with grpc.WithResolvers, as NewClient does;
// or make e the engine of the globally registered lanes scheme with Register.
//
// Each endpoint has one address, the instance's Addr, and carries the
// registry.Instance as an attribute. The state carries the engine's handle
// of the service in its attributes, and a service config
// that selects the lanes balancer, with the caller's zone (WithZone, else
// LANES_ZONE read through WithEnv), and the retry policy of the methods of
// WithIdempotent. A service config from the resolver takes precedence over
// grpc.WithDefaultServiceConfig.
//
// The resolver waits until the engine has listed the service, then follows
// the engine's view. It re-reads that view at once when gRPC asks it to
// (ResolveNow: the lanes picker asks when the engine picks an instance that
// has no connection yet, and gRPC asks when a connection fails), and at
// least once a second otherwise.
func NewBuilder(e *routing.Engine, opts ...ClientOption) resolver.Builder {
	return &builder{e: e, cfg: clientConfig(opts)}
}

type builder struct {
	e   *routing.Engine
	cfg *config
}

func (b *builder) Scheme() string { return Scheme }

func (b *builder) Build(t resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	name, err := serviceOf(t)
	if err != nil {
		return nil, err
	}
	idem, err := parseMethods(b.cfg.idempotent)
	if err != nil {
		return nil, err
	}
	sc := cc.ParseServiceConfig(serviceConfigJSON(b.cfg.caller(), idem, b.cfg.health))
	if sc.Err != nil {
		return nil, fmt.Errorf("lanesgrpc: service config: %w", sc.Err)
	}
	svc := b.e.Service(name)
	return startResolver(cc, b.e, svc, svc, sc, b.cfg), nil
}

// targetForm is the form of a lanes target, for error messages.
const targetForm = `want lanes:///<service>, such as "lanes:///orders" (three slashes, no port)`

// serviceOf returns the service a target names, or an error naming the form
// expected: lanes:///<service>, with no authority, port or path.
func serviceOf(t resolver.Target) (string, error) { return serviceIn(t, t.String()) }

func serviceIn(t resolver.Target, shown string) (string, error) {
	u := t.URL
	name := t.Endpoint()
	switch {
	case u.Host != "" || u.User != nil:
		return "", fmt.Errorf("lanesgrpc: target %q: %s; %q is read as an authority", shown, targetForm, u.Host)
	case u.Opaque != "":
		return "", fmt.Errorf("lanesgrpc: target %q: %s", shown, targetForm)
	case u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(name, "/:"):
		return "", fmt.Errorf("lanesgrpc: target %q: %s; the service name is the whole path, without a port", shown, targetForm)
	}
	if err := registry.CheckService(name); err != nil {
		return "", fmt.Errorf("lanesgrpc: target %q: %s: %w", shown, targetForm, err)
	}
	return name, nil
}

// CheckTarget reports whether target is a lanes target in the form the
// resolver reads, lanes:///<service>, with an error naming that form when
// it is not. grpc.NewClient does not build the resolver until the first
// call, so the resolver's own refusal surfaces only then; CheckTarget says
// it up front.
func CheckTarget(target string) error {
	u, err := url.Parse(target)
	if err != nil || u.Scheme != Scheme {
		return fmt.Errorf("lanesgrpc: target %q: %s", target, targetForm)
	}
	_, err = serviceIn(resolver.Target{URL: *u}, target)
	return err
}

// registered is the engine of the globally registered lanes scheme.
var registered atomic.Pointer[builder]

func init() { resolver.Register(globalBuilder{}) }

// Register makes e the engine of lanes:/// targets dialled without a
// resolver of their own, so that a plain
//
//	grpc.NewClient("lanes:///orders",
//		grpc.WithTransportCredentials(insecure.NewCredentials()),
//		grpc.WithChainUnaryInterceptor(lanesgrpc.UnaryClientInterceptor()),
//		grpc.WithChainStreamInterceptor(lanesgrpc.StreamClientInterceptor()))
//
// routes every call with e: the scheme is registered with gRPC when this
// package is imported, and its service config selects the lanes balancer.
// The client interceptors carry the lane to the server. opts are those of
// NewBuilder (WithZone, WithIdempotent, WithHealthCheck). Register may be
// called again, for example in tests; connections built before keep the
// engine they were built with. Clients made with NewClient, or with
// grpc.WithResolvers(NewBuilder(...)), use their own engine.
func Register(e *routing.Engine, opts ...ClientOption) {
	if e == nil {
		registered.Store(nil)
		return
	}
	registered.Store(&builder{e: e, cfg: clientConfig(opts)})
}

// globalBuilder is the lanes scheme registered with gRPC: it builds with the
// engine of Register.
type globalBuilder struct{}

func (globalBuilder) Scheme() string { return Scheme }

func (globalBuilder) Build(t resolver.Target, cc resolver.ClientConn, o resolver.BuildOptions) (resolver.Resolver, error) {
	if _, err := serviceOf(t); err != nil {
		return nil, err
	}
	b := registered.Load()
	if b == nil {
		return nil, fmt.Errorf("lanesgrpc: target %q: no routing engine for lanes targets: call lanesgrpc.Register(engine) at start-up, or dial with lanesgrpc.NewClient(engine, service)", t.String())
	}
	return b.Build(t, cc, o)
}

// source is what the resolver reads: a *routing.Service.
type source interface {
	Instances() []registry.Instance
	Ready() <-chan struct{}
}

// notifier is the change notification that the resolver uses instead of its
// periodic re-read when the source offers it. *routing.Service does not yet;
// see docs/grpc.md ("Resolver") for the proposed method.
type notifier interface {
	// Changed returns a channel that is closed at the next change of the
	// instances: read it before Instances, wait on it after.
	Changed() <-chan struct{}
}

type lanesResolver struct {
	metrics *lanesmetrics.Requests
	cc      resolver.ClientConn
	eng     *routing.Engine
	svc     *routing.Service
	src     source
	sc      *serviceconfig.ParseResult
	refresh time.Duration
	now     chan struct{} // ResolveNow requests; capacity 1

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startResolver(cc resolver.ClientConn, e *routing.Engine, svc *routing.Service, src source, sc *serviceconfig.ParseResult, cfg *config) *lanesResolver {
	r := &lanesResolver{cc: cc, eng: e, svc: svc, src: src, sc: sc, refresh: cfg.refresh, now: make(chan struct{}, 1), metrics: cfg.metrics}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.wg.Add(1)
	go r.run()
	return r
}

// ResolveNow asks for an immediate re-read. It does not block.
func (r *lanesResolver) ResolveNow(resolver.ResolveNowOptions) {
	select {
	case r.now <- struct{}{}:
	default:
	}
}

// Close stops the resolver and waits for its goroutine.
func (r *lanesResolver) Close() {
	r.cancel()
	r.wg.Wait()
}

func (r *lanesResolver) run() {
	defer r.wg.Done()
	select {
	case <-r.src.Ready():
	case <-r.ctx.Done():
		return
	}
	n, _ := r.src.(notifier)
	var tick <-chan time.Time
	if n == nil {
		t := time.NewTicker(r.refresh)
		defer t.Stop()
		tick = t.C
	}
	var last []registry.Instance
	push := true
	for {
		var changed <-chan struct{}
		if n != nil {
			changed = n.Changed()
		}
		insts := r.src.Instances()
		slices.SortFunc(insts, func(a, b registry.Instance) int { return cmp.Compare(a.ID, b.ID) })
		if push || !slices.EqualFunc(insts, last, registry.Instance.Equal) {
			r.push(insts)
			last = insts
		}
		select {
		case <-r.ctx.Done():
			return
		case <-r.now:
			// An explicit request always pushes: the balancer clears its
			// pending request when it gets a state.
			push = true
		case <-changed:
			push = false
		case <-tick:
			push = false
		}
	}
}

func (r *lanesResolver) push(insts []registry.Instance) {
	eps := make([]resolver.Endpoint, 0, len(insts))
	for _, in := range insts {
		ep := resolver.Endpoint{Addresses: []resolver.Address{{Addr: in.Addr}}}
		eps = append(eps, setInstance(ep, in))
	}
	// The error is the balancer's verdict on the state (for example
	// ErrBadResolverState); there is nothing better to send, and gRPC
	// itself asks again with backoff.
	_ = r.cc.UpdateState(setMetrics(setEngine(setService(resolver.State{Endpoints: eps, ServiceConfig: r.sc}, r.svc), r.eng), r.metrics))
}

// Retry policy of idempotent methods: one retry, after about 10ms.
const (
	retryAttempts = 2
	retryBackoff  = "0.01s"
)

// serviceConfigJSON is the service config the resolver supplies: the lanes
// balancer, and the retry policy of the idempotent methods.
func serviceConfigJSON(caller LBConfig, idem methodSet, health *string) string {
	type name struct {
		Service string `json:"service"`
		Method  string `json:"method,omitempty"`
	}
	type retryPolicy struct {
		MaxAttempts          int      `json:"maxAttempts"`
		InitialBackoff       string   `json:"initialBackoff"`
		MaxBackoff           string   `json:"maxBackoff"`
		BackoffMultiplier    float64  `json:"backoffMultiplier"`
		RetryableStatusCodes []string `json:"retryableStatusCodes"`
	}
	type methodConfig struct {
		Name        []name      `json:"name"`
		RetryPolicy retryPolicy `json:"retryPolicy"`
	}
	type throttling struct {
		MaxTokens  int     `json:"maxTokens"`
		TokenRatio float64 `json:"tokenRatio"`
	}
	type healthCheck struct {
		ServiceName string `json:"serviceName"`
	}
	type sc struct {
		LB           []map[string]LBConfig `json:"loadBalancingConfig"`
		MethodConfig []methodConfig        `json:"methodConfig,omitempty"`
		Throttling   *throttling           `json:"retryThrottling,omitempty"`
		Health       *healthCheck          `json:"healthCheckConfig,omitempty"`
	}
	doc := sc{LB: []map[string]LBConfig{{Name: caller}}}
	if health != nil {
		doc.Health = &healthCheck{ServiceName: *health}
	}
	if !idem.empty() {
		var names []name
		for s := range idem.services {
			names = append(names, name{Service: s})
		}
		for m := range idem.methods {
			s, meth, _ := splitMethod(m)
			if !idem.services[s] {
				names = append(names, name{Service: s, Method: meth})
			}
		}
		slices.SortFunc(names, func(a, b name) int {
			return cmp.Or(cmp.Compare(a.Service, b.Service), cmp.Compare(a.Method, b.Method))
		})
		doc.MethodConfig = []methodConfig{{Name: names, RetryPolicy: retryPolicy{
			MaxAttempts:          retryAttempts,
			InitialBackoff:       retryBackoff,
			MaxBackoff:           retryBackoff,
			BackoffMultiplier:    1,
			RetryableStatusCodes: []string{"UNAVAILABLE"},
		}}}
		// gRPC's retry throttling: a failure that could be retried costs a
		// token, a success returns a tenth of one, and retries pause while
		// half of the tokens are gone, so that an outage is not doubled.
		doc.Throttling = &throttling{MaxTokens: 100, TokenRatio: 0.1}
	}
	b, err := json.Marshal(doc)
	if err != nil {
		panic(err) // plain structs: cannot fail
	}
	return string(b)
}
