// Package xds is the xDS server of lanes up: it serves the resources that
// internal/lib/xdsroute makes from the registry and the policy to gRPC's
// proxyless clients, over ADS and the separate discovery streams (state of
// the world and incremental), and keeps them current as instances and the
// policy change (docs/xds.md).
package xds

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/lib/accept"
	"github.com/lanesdev/lanes/internal/lib/backoff"
	"github.com/lanesdev/lanes/internal/lib/gogroup"
	"github.com/lanesdev/lanes/internal/lib/xdsroute"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// Who may open a discovery stream.
const (
	// AuthToken: a client sends "authorization: Bearer <token>" in its
	// stream's metadata, a token the control plane's token store accepts
	// (the admin token, or a registration token of any scope: every
	// client may read every route, and nothing else is served).
	AuthToken = "token"
	// AuthLoopback: clients on loopback addresses only, without a token.
	AuthLoopback = "loopback"
)

// Bounds on what a client sends.
const (
	MaxNodeIDBytes       = 256
	MaxResourceNames     = 10_000
	MaxResourceNameBytes = 512
	// MaxLocalityBytes bounds a node's zone and sub-zone: a longer one is
	// taken as unknown.
	MaxLocalityBytes = 128
	// MaxGroups bounds the sets of resources kept at once, one per
	// locality (zone and host) of the clients; the clients of a locality
	// beyond it get the resources of no locality.
	MaxGroups = 1024
	// MaxRecvBytes bounds one message from a client.
	MaxRecvBytes = 1 << 20
	// MaxStreamsPerConn bounds the streams of one connection.
	MaxStreamsPerConn = 16
)

// TokenChecker checks a bearer token: admin.Tokens.
type TokenChecker interface {
	Check(ctx context.Context, tok string) (admin bool, t adminapi.Token, err error)
}

// Config configures a Server.
type Config struct {
	// Registry is watched for the services and their instances.
	Registry registry.Registry
	// Engine is the policy in force, and each service's instances as the
	// routing engine holds them: through an outage of the registry, the
	// instances whose leases expired at once are held a while, as the
	// engine holds them for every other data path (routing.WithRegistry
	// on the same registry; routing.WithPolicyStore).
	Engine *routing.Engine
	Auth   string       // AuthToken (the default) or AuthLoopback
	Tokens TokenChecker // for AuthToken
	// IsUnauthorized tells Tokens' refusal of a token from a failure to
	// check it (admin.IsUnauthorized); nil takes every error as a refusal.
	IsUnauthorized func(error) bool
	Logger         *slog.Logger
	Metrics        prometheus.Registerer // nil: none
	// Debounce is how long a change waits for more before the resources
	// are made again (default 50 ms): a burst of changes makes one push.
	Debounce time.Duration
	// MaxConns caps the connections open at once (default 1,000).
	MaxConns int
	// TLS, when set, is what the server serves TLS with; nil: plain gRPC.
	TLS *tls.Config
}

// Server serves xDS. New starts following the registry and the policy;
// Serve serves a listener; Close stops both.
type Server struct {
	cfg   Config
	log   *slog.Logger
	cache cachev3.SnapshotCache
	grpc  *grpc.Server
	g     *gogroup.Group
	m     metrics

	mu     sync.Mutex
	groups map[string]group           // by node-hash key
	subs   map[streamID]*subscription // by stream: the listeners it asks for
	sent   map[streamType]sentResponse
	state  registry.State
	ready  bool // the registry was listed

	wake chan struct{} // a change to push; buffered 1

	// The build goroutine's: what the last push held.
	lastRoutes   []*routev3.RouteConfiguration
	lastClusters map[string]*clusterv3.Cluster
	retired      map[string]retiredCluster
	followed     map[string]bool // services whose engine changes poke

	pushed chan struct{} // closed and replaced after each push; under mu
}

type streamType struct {
	stream  int64
	typeURL string
}

type sentResponse struct {
	nonce, version string
	nacked         bool // the client refused it
}

// New validates cfg and starts following the registry and the policy.
func New(cfg Config) (*Server, error) {
	switch cfg.Auth {
	case "":
		cfg.Auth = AuthToken
	case AuthToken, AuthLoopback:
	default:
		return nil, fmt.Errorf("xds auth %q: want %s or %s", cfg.Auth, AuthToken, AuthLoopback)
	}
	if cfg.Auth == AuthToken && cfg.Tokens == nil {
		return nil, errors.New("xds auth token needs a token checker")
	}
	if cfg.Registry == nil || cfg.Engine == nil {
		return nil, errors.New("xds needs a registry and a routing engine")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = 50 * time.Millisecond
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 1000
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "xds"), groups: map[string]group{}, subs: map[streamID]*subscription{},
		sent: map[streamType]sentResponse{}, retired: map[string]retiredCluster{}, followed: map[string]bool{}, wake: make(chan struct{}, 1), pushed: make(chan struct{})}
	s.m = newMetrics(cfg.Metrics)
	// Not ADS-consistent: gRPC clients subscribe to clusters one by one,
	// and an ADS-consistent cache would answer none until all are asked.
	s.cache = cachev3.NewSnapshotCache(false, nodeHash{s}, cacheLogger{s.log})
	s.g = gogroup.New()
	xs := serverv3.NewServer(s.g.Context(), s.cache, s.callbacks())
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxRecvBytes),
		grpc.MaxConcurrentStreams(MaxStreamsPerConn),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ChainStreamInterceptor(s.authenticate),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			return nil, status.Error(codes.Unimplemented, "lanes serves xDS over streams only")
		}),
	}
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	s.grpc = grpc.NewServer(opts...)
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(s.grpc, xs)
	listenerservice.RegisterListenerDiscoveryServiceServer(s.grpc, xs)
	routeservice.RegisterRouteDiscoveryServiceServer(s.grpc, xs)
	clusterservice.RegisterClusterDiscoveryServiceServer(s.grpc, xs)
	endpointservice.RegisterEndpointDiscoveryServiceServer(s.grpc, xs)

	s.g.Go(func() { s.watchRegistry(s.g.Context()) })
	s.g.Go(func() { s.build(s.g.Context()) })
	return s, nil
}

// Serve serves xDS on ln until Close; the connections are capped and
// accept errors waited out.
func (s *Server) Serve(ln net.Listener) error {
	l := accept.Wrap(ln, accept.Options{Name: "xDS", MaxConns: s.cfg.MaxConns, Logger: s.log})
	err := s.grpc.Serve(l)
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Close stops serving (open streams end) and following, and waits.
func (s *Server) Close() error {
	s.grpc.Stop()
	s.g.Close()
	return nil
}

// Pushed returns a channel closed after the next push of resources.
func (s *Server) Pushed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pushed
}

func (s *Server) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// watchRegistry follows every service's instances: list, then watch;
// again after an error, with a backoff.
func (s *Server) watchRegistry(ctx context.Context) {
	bo := backoff.New(100*time.Millisecond, 5*time.Second)
	for ctx.Err() == nil {
		w, err := s.cfg.Registry.Watch(ctx, "")
		if err != nil {
			s.log.Warn("watching the registry", "err", err)
			bo.Wait(ctx)
			continue
		}
		for {
			b, err := w.Next(ctx)
			if err != nil {
				if ctx.Err() == nil {
					s.log.Warn("watching the registry", "err", err)
				}
				break
			}
			bo.Reset()
			s.mu.Lock()
			s.state.Apply(b)
			s.ready = true
			s.mu.Unlock()
			s.poke()
		}
		_ = w.Close()
		bo.Wait(ctx)
	}
}

// build makes and publishes the resources of every group after each
// change, a burst of changes at once, and when a lane expires.
func (s *Server) build(ctx context.Context) {
	var expiry *time.Timer
	var expiryC <-chan time.Time
	defer func() {
		if expiry != nil {
			expiry.Stop()
		}
	}()
	// Read before the policy is (in push), so that no change is missed.
	policyChanged := s.cfg.Engine.PolicyChanged()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-policyChanged:
		case <-expiryC:
		}
		// Debounce: the changes of a burst arrive meanwhile.
		t := time.NewTimer(s.cfg.Debounce)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		select { // taken in by this build
		case <-s.wake:
		default:
		}
		policyChanged = s.cfg.Engine.PolicyChanged()
		next := s.push(ctx)
		if expiry != nil {
			expiry.Stop()
			expiry, expiryC = nil, nil
		}
		if !next.IsZero() {
			expiry = time.NewTimer(time.Until(next))
			expiryC = expiry.C
		}
	}
}

// RetireAfter is how long a cluster that the resources no longer hold is
// still served, without endpoints: a client takes in routes and clusters
// apart, and a route it still holds must not name a cluster that is gone
// (its calls would fail); a call it sends there follows the cluster's chain
// past the empty lane. MaxRetired bounds them; the oldest go first.
const (
	RetireAfter = 30 * time.Second
	MaxRetired  = 10_000
)

type retiredCluster struct {
	c  *clusterv3.Cluster
	at time.Time
}

// push makes the resources of every group and sets them in the cache,
// make before break: when the routes change, the clusters and endpoints
// they will name go out first with the routes in force, and the new routes
// after Debounce; a cluster that left stays a while (RetireAfter). It
// returns when the resources next change by time alone.
func (s *Server) push(ctx context.Context) time.Time {
	s.mu.Lock()
	if !s.ready {
		s.mu.Unlock()
		return time.Time{}
	}
	names := map[string]bool{}
	for name := range s.state.Services {
		names[name] = true
	}
	groups := make(map[string]group, len(s.groups))
	for k, g := range s.groups {
		groups[k] = g
	}
	s.mu.Unlock()
	for _, name := range s.cfg.Engine.Services() {
		names[name] = true
	}
	var insts []registry.Instance
	for name := range names {
		svc := s.cfg.Engine.Service(name)
		if !s.followed[name] {
			s.followed[name] = true
			s.g.Go(func() { s.follow(ctx, svc) })
		}
		select {
		case <-svc.Ready():
			insts = append(insts, svc.Instances()...)
		default: // the engine's first list is on its way: the registry's
			s.mu.Lock()
			for _, in := range s.state.Services[name] {
				insts = append(insts, in)
			}
			s.mu.Unlock()
		}
	}

	slices.SortFunc(insts, func(a, b registry.Instance) int {
		return strings.Compare(a.Service+"/"+a.ID, b.Service+"/"+b.ID)
	})
	now := time.Now()
	f := xdsroute.Fleet{Policy: s.cfg.Engine.Policy(), Instances: insts, Now: now}
	pr := xdsroute.Prepare(f)
	base := pr.For(xdsroute.Caller{})
	s.retire(base.Clusters, now)
	// The resources every group shares, each type with its version.
	clusters := slices.Clone(base.Clusters)
	var emptied []*endpointv3.ClusterLoadAssignment
	for _, rc := range s.retired {
		clusters = append(clusters, rc.c)
		if rc.c.GetEdsClusterConfig() != nil {
			emptied = append(emptied, &endpointv3.ClusterLoadAssignment{ClusterName: rc.c.Name})
		}
	}
	// The endpoints of each locality, shared by its variants.
	endpoints := make(map[xdsroute.Caller]cachev3.Resources, len(groups))
	for _, g := range groups {
		if _, ok := endpoints[g.caller]; !ok {
			endpoints[g.caller] = typed(append(pr.For(g.caller).Endpoints, emptied...))
		}
	}
	routesChanged := s.lastRoutes != nil && !equalAll(s.lastRoutes, base.Routes)
	set := func(routes []*routev3.RouteConfiguration) {
		// The listeners, routes and clusters of each variant (and
		// Envoy's listener address), made once for its groups.
		shared := map[group]*[3]cachev3.Resources{}
		for key, g := range groups {
			v := group{variant: g.variant, egress: g.egress}
			sh := shared[v]
			if sh == nil {
				r := &xdsroute.Resources{Listeners: base.Listeners, Routes: routes, Clusters: clusters}
				if g.variant == xdsroute.Envoy {
					r = xdsroute.ForEnvoy(r, g.egress)
				}
				sh = &[3]cachev3.Resources{typed(r.Listeners), typed(r.Routes), typed(r.Clusters)}
				shared[v] = sh
			}
			snap := &cachev3.Snapshot{}
			snap.Resources[types.Listener] = sh[0]
			snap.Resources[types.Route] = sh[1]
			snap.Resources[types.Cluster] = sh[2]
			snap.Resources[types.Endpoint] = endpoints[g.caller]
			if err := s.cache.SetSnapshot(ctx, key, snap); err != nil {
				s.log.Error("setting the xDS snapshot", "group", key, "err", err)
			}
		}
	}
	if routesChanged {
		set(s.lastRoutes)
		t := time.NewTimer(s.cfg.Debounce)
		select {
		case <-ctx.Done():
			t.Stop()
			return time.Time{}
		case <-t.C:
		}
	}
	set(base.Routes)
	s.lastRoutes = base.Routes
	s.m.pushes.Inc()
	s.mu.Lock()
	close(s.pushed)
	s.pushed = make(chan struct{})
	s.mu.Unlock()
	return xdsroute.NextChange(f)
}

// follow has the resources made again when the engine's instances of svc
// change (the held ones among them).
func (s *Server) follow(ctx context.Context, svc *routing.Service) {
	select {
	case <-ctx.Done():
		return
	case <-svc.Ready():
		s.poke()
	}
	for {
		changed := svc.Changed()
		select {
		case <-ctx.Done():
			return
		case <-changed:
			s.poke()
		}
	}
}

// retire keeps the clusters that left the resources (and drops those
// retired for RetireAfter, or beyond MaxRetired, the oldest first).
func (s *Server) retire(clusters []*clusterv3.Cluster, now time.Time) {
	current := make(map[string]*clusterv3.Cluster, len(clusters))
	for _, c := range clusters {
		current[c.Name] = c
		delete(s.retired, c.Name)
	}
	for name, c := range s.lastClusters {
		if _, ok := current[name]; !ok {
			s.retired[name] = retiredCluster{c: c, at: now}
		}
	}
	s.lastClusters = current
	var order []string
	for name, rc := range s.retired {
		if now.Sub(rc.at) >= RetireAfter {
			delete(s.retired, name)
			continue
		}
		order = append(order, name)
	}
	if over := len(order) - MaxRetired; over > 0 {
		slices.SortFunc(order, func(a, b string) int { return s.retired[a].at.Compare(s.retired[b].at) })
		for _, name := range order[:over] {
			delete(s.retired, name)
		}
	}
}

func equalAll[T proto.Message](a, b []T) bool {
	return slices.EqualFunc(a, b, func(x, y T) bool { return proto.Equal(x, y) })
}

// typed is items as the cache's resources of one type, whose version is
// the hash of the items: a type whose resources did not change keeps its
// version, and is not sent again.
func typed[T types.Resource](items []T) cachev3.Resources {
	h := sha256.New()
	opts := proto.MarshalOptions{Deterministic: true}
	for _, it := range items {
		b, _ := opts.Marshal(it)
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	return cachev3.NewResources(hex.EncodeToString(h.Sum(nil))[:16], asResources(items))
}

func asResources[T types.Resource](xs []T) []types.Resource {
	out := make([]types.Resource, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}
