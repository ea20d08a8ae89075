package lanesgrpc

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/base"
	"google.golang.org/grpc/balancer/endpointsharding"
	"google.golang.org/grpc/balancer/pickfirst"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"

	"github.com/lanesdev/lanes/internal/lib/cowmap"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesmetrics"
	"github.com/lanesdev/lanes/routing"
)

// Name is the name of the lanes load-balancing policy, as it appears in a
// service config: {"loadBalancingConfig": [{"lanes": {"zone": "az1"}}]}.
const Name = "lanes"

func init() { balancer.Register(builderLB{}) }

// LBConfig is the configuration of the lanes balancer in a service config.
type LBConfig struct {
	serviceconfig.LoadBalancingConfig `json:"-"`

	// Zone is the caller's zone, for the engine's zone preference; "" when
	// unknown.
	Zone string `json:"zone,omitempty"`
	// Host is the caller's host, for the same-host rule (the policy's
	// locality.host); "" when unknown.
	Host string `json:"host,omitempty"`
}

type builderLB struct{}

func (builderLB) Name() string { return Name }

// Build returns a balancer that keeps one pick_first child per endpoint (as
// grpc-go's round_robin does, through endpointsharding) and publishes its
// own picker, which asks the routing engine for every call.
func (builderLB) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	b := &lanesBalancer{cc: cc, md: &laneMDCache{}}
	b.child = endpointsharding.NewBalancer(childCC{ClientConn: cc, b: b}, opts, balancer.Get(pickfirst.Name).Build, endpointsharding.Options{})
	return b
}

// ParseConfig reads an LBConfig. Unknown fields are ignored.
func (builderLB) ParseConfig(js json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	var c LBConfig
	if err := json.Unmarshal(js, &c); err != nil {
		return nil, fmt.Errorf("lanes: bad balancer config %s: %w", js, err)
	}
	return &c, nil
}

// errNoService is the picker error when the resolver is not the lanes one.
var errNoService = errors.New("lanes: the lanes balancer needs the lanes resolver (a lanes:///service target; see lanesgrpc.NewBuilder)")

// lanesBalancer is the lanes load-balancing policy. The routing engine
// chooses the instance of every call; the balancer only keeps a connection
// to every instance the resolver lists, and publishes pickers that map the
// engine's choice to a ready connection.
type lanesBalancer struct {
	cc    balancer.ClientConn
	child balancer.Balancer // endpointsharding over pick_first
	md    *laneMDCache

	// resolving is set while a ResolveNow asked by a picker is outstanding;
	// the next resolver state clears it.
	resolving atomic.Bool

	mu      sync.Mutex // serialises picker builds, guards the fields below
	eng     *routing.Engine
	svc     *routing.Service
	place   LBConfig                           // the caller's zone and host
	dones   map[string]func(balancer.DoneInfo) // by instance id; replaced, never modified
	metrics *lanesmetrics.Requests
}

func (b *lanesBalancer) UpdateClientConnState(s balancer.ClientConnState) error {
	svc := serviceFromState(s.ResolverState)
	if svc == nil {
		b.cc.UpdateState(balancer.State{ConnectivityState: connectivity.TransientFailure, Picker: base.NewErrPicker(errNoService)})
		return balancer.ErrBadResolverState
	}
	var place LBConfig
	if c, ok := s.BalancerConfig.(*LBConfig); ok && c != nil {
		place = LBConfig{Zone: c.Zone, Host: c.Host}
	}

	b.mu.Lock()
	dones := make(map[string]func(balancer.DoneInfo), len(s.ResolverState.Endpoints))
	for _, ep := range s.ResolverState.Endpoints {
		in, ok := instanceFromEndpoint(ep)
		if !ok {
			continue
		}
		if f := b.dones[in.ID]; f != nil && svc == b.svc {
			dones[in.ID] = f
		} else {
			dones[in.ID] = reportFunc(svc, in.ID)
		}
	}
	b.eng, b.svc, b.place, b.dones = engineFromState(s.ResolverState), svc, place, dones
	b.metrics = metricsFromState(s.ResolverState)
	b.mu.Unlock()
	b.resolving.Store(false)

	// The child calls childCC.UpdateState synchronously at the end, which
	// publishes a picker with the new service, place and instances.
	err := b.child.UpdateClientConnState(balancer.ClientConnState{
		// Lets pick_first use client-side health checks when the service
		// config enables them, as round_robin does.
		ResolverState: pickfirst.EnableHealthListener(s.ResolverState),
	})
	if len(s.ResolverState.Endpoints) == 0 {
		// No instance is a valid answer, not a bad resolver state: the
		// picker then returns the engine's no_instance error.
		return nil
	}
	return err
}

func (b *lanesBalancer) ResolverError(err error) {
	b.mu.Lock()
	noState := b.svc == nil
	b.mu.Unlock()
	if noState {
		b.cc.UpdateState(balancer.State{ConnectivityState: connectivity.TransientFailure,
			Picker: base.NewErrPicker(fmt.Errorf("lanes: resolver: %w", err))})
		return
	}
	b.child.ResolverError(err)
}

func (b *lanesBalancer) UpdateSubConnState(balancer.SubConn, balancer.SubConnState) {
	// Deprecated by gRPC; the pick_first children use state listeners.
}

func (b *lanesBalancer) ExitIdle() { b.child.ExitIdle() }

func (b *lanesBalancer) Close() { b.child.Close() }

// requestResolve asks the resolver for a fresh state, once until it comes.
func (b *lanesBalancer) requestResolve() {
	if b.resolving.CompareAndSwap(false, true) {
		b.cc.ResolveNow(resolver.ResolveNowOptions{})
	}
}

// childCC intercepts the state updates of the endpointsharding child.
type childCC struct {
	balancer.ClientConn
	b *lanesBalancer
}

// UpdateState builds the lanes picker from the children's states and
// publishes it with the aggregated connectivity state.
func (c childCC) UpdateState(s balancer.State) {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock() // held while publishing, so pickers are published in order
	children := endpointsharding.ChildStatesFromPicker(s.Picker)
	conns := make(map[string]conn, len(children))
	for _, ch := range children {
		if len(ch.Endpoint.Addresses) == 0 {
			continue
		}
		conns[ch.Endpoint.Addresses[0].Addr] = conn{state: ch.State.ConnectivityState, picker: ch.State.Picker}
	}
	b.cc.UpdateState(balancer.State{
		ConnectivityState: s.ConnectivityState,
		Picker:            &picker{eng: b.eng, svc: b.svc, zone: b.place.Zone, host: b.place.Host, conns: conns, dones: b.dones, b: b, metrics: b.metrics},
	})
}

// laneMDCache holds the metadata a picker adds to carry a canary lane: one
// immutable metadata.MD per lane, built once.
type laneMDCache struct {
	m cowmap.Map[string, metadata.MD]
}

// maxCachedLanes bounds the cache; canary lanes are few.
const maxCachedLanes = 64

// get returns the metadata that carries lane l (x-lane and the baggage
// member). The caller must not modify it. It does not allocate once l is
// cached.
func (c *laneMDCache) get(l string) metadata.MD {
	if md, ok := c.m.Load(l); ok {
		return md
	}
	md, _ := c.m.LoadOrStore(l, func() metadata.MD {
		md := metadata.MD{}
		lane.Propagator{}.InjectLane(l, lane.Metadata(md))
		return md
	}, maxCachedLanes)
	return md
}
