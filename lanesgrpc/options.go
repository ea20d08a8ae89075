package lanesgrpc

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/lanesdev/lanes/internal/lib/roles"
	"github.com/lanesdev/lanes/internal/lib/routedcall"
	"github.com/lanesdev/lanes/internal/lib/serving"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesmetrics"
	"github.com/lanesdev/lanes/lanestrace"
	"github.com/lanesdev/lanes/registry"
)

// A ClientOption configures the client side: NewClient, NewBuilder,
// Register and the client interceptors.
type ClientOption interface{ ApplyClient(*config) }

// A ServerOption configures the server side: NewServer, ServerOptions, the
// server interceptors and Serve.
type ServerOption interface{ ApplyServer(*config) }

// An Option configures both sides, and means the same on each: WithZone,
// WithPropagator, WithLogger and WithEnv.
type Option interface {
	ClientOption
	ServerOption
}

// Defaults.
const (
	// DefaultShutdownTimeout is how long Serve lets calls in flight finish
	// after deregistering, before it stops the server hard.
	DefaultShutdownTimeout = 30 * time.Second
	// DefaultResponseHeaderTimeout is how long an instance may take to
	// answer a unary call (see WithResponseHeaderTimeout).
	DefaultResponseHeaderTimeout = routedcall.DefaultResponseHeaderTimeout
	// defaultRefresh is how often the resolver re-reads the engine's view of
	// the service when nothing asked it to (see resolver.go).
	defaultRefresh = time.Second
)

func defaults() *config {
	return &config{log: slog.Default(), shutdown: DefaultShutdownTimeout, refresh: defaultRefresh, getenv: os.Getenv}
}

// serving returns the settings of Serve's serving.Run.
func (c *config) serving(name string, stop func() error, closed error) serving.Options {
	return serving.Options{Name: name, Stop: stop, Closed: closed, Lane: c.lane, Zone: c.zone, ZoneSet: c.zoneSet,
		Getenv: c.getenv, TTL: c.ttl, Drain: c.drain, Logger: c.log, Guard: c.guard}
}

func clientConfig(opts []ClientOption) *config { return roles.ClientConfig(defaults(), opts) }

func serverConfig(opts []ServerOption) *config { return roles.ServerConfig(defaults(), opts) }

// caller is the caller's place, as the balancer takes it: its zone
// (WithZone, else LANES_ZONE) and its host (registry.LocalHost: LANES_HOST,
// else the machine's host name).
func (c *config) caller() LBConfig {
	zone := c.zone
	if !c.zoneSet {
		zone = strings.TrimSpace(c.getenv(registry.EnvZone))
	}
	return LBConfig{Zone: zone, Host: registry.LocalHost(c.getenv)}
}

// WithZone sets the zone of this process. For NewClient and NewBuilder it is
// the caller's zone, for the engine's zone preference (default: LANES_ZONE).
// For Serve it is the instance's zone when the instance does not set one
// (before LANES_ZONE).
func WithZone(zone string) Option {
	return option(func(c *config) { c.zone, c.zoneSet = zone, true })
}

// WithPropagator sets the propagator that reads and writes the lane in
// metadata, for alias headers (client and server interceptors). The default
// is the zero lane.Propagator: x-lane and the baggage member "lane".
func WithPropagator(p lane.Propagator) Option {
	return option(func(c *config) { c.prop = p })
}

// WithTracerProvider traces calls with tp, through otelgrpc's stats handlers (NewClient,
// NewServer, ServerOptions): each client span carries the routing decision of its call and each
// server span the lane received, the instance's own lane and the guard's verdict (see
// docs/tracing.md). The default is lanestrace.TracerProvider(), which lanestrace.FromEnv sets;
// with neither, calls are not traced and cost nothing more.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return option(func(c *config) { c.tp = tp })
}

// WithMetrics counts every call's routing decision in m (lanes_requests_total by service,
// requested lane, served lane and reason; see lanesmetrics). It is read by NewClient and
// NewBuilder.
func WithMetrics(m *lanesmetrics.Requests) ClientOption {
	return clientOption(func(c *config) { c.metrics = m })
}

// WithLogger sets the logger of the server interceptors, the resolver and
// Serve (default: slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return option(func(c *config) {
		if l != nil {
			c.log = l
		}
	})
}

// WithIdempotent lists the methods that are safe to send twice: a call to one
// of them that fails with Unavailable (which includes connection errors) is
// retried once, on another instance of the same lane set, within the caller's
// deadline. Each entry is a full method name, "/package.Service/Method", or
// "/package.Service/*" for every method of a service. Other methods are not
// retried (gRPC's transparent retry of calls that never reached a server
// still applies).
//
// It is read by NewClient and NewBuilder (which put the retry policy in the
// service config) and by the client interceptors (which tell the picker to
// avoid the instance that failed).
func WithIdempotent(methods ...string) ClientOption {
	return clientOption(func(c *config) { c.idempotent = append(c.idempotent, methods...) })
}

// WithResponseHeaderTimeout bounds how long an instance may take to answer
// a unary call (read by the client interceptors; default
// DefaultResponseHeaderTimeout, negative: none). A call whose own deadline
// comes sooner is left to it. An attempt cut by the timeout is reported
// failed to outlier detection, so that a hung or paused (SIGSTOP) instance
// is ejected; a call to a WithIdempotent method is then sent once more, to
// another instance, and otherwise fails with Unavailable. Streaming calls,
// which may rightly wait long for their first message, are not cut.
func WithResponseHeaderTimeout(d time.Duration) ClientOption {
	return clientOption(func(c *config) { c.timeout = d })
}

// WithHealthCheck turns on gRPC client-side health checking (read by
// NewClient and NewBuilder, which put it in the service config): each
// connection watches the grpc.health.v1 status of service ("" for the
// server as a whole), and an instance that is not SERVING counts as
// unreachable, so that the engine ejects it and routes around it. The
// servers must run the health service.
func WithHealthCheck(service string) ClientOption {
	return clientOption(func(c *config) { c.health = &service })
}

// WithServerOptions adds options to the grpc.NewServer call of NewServer,
// for example the transport credentials; interceptors given here run before
// the lanes interceptors.
func WithServerOptions(opts ...grpc.ServerOption) ServerOption {
	return serverOption(func(c *config) { c.srvOpts = append(c.srvOpts, opts...) })
}

// WithDialOptions adds options to the grpc.NewClient call of NewClient, for
// example the transport credentials, which NewClient does not choose.
func WithDialOptions(opts ...grpc.DialOption) ClientOption {
	return clientOption(func(c *config) { c.dialOpts = append(c.dialOpts, opts...) })
}

// WithGuard installs the guard g (NewServer, ServerOptions, the server
// interceptors): they refuse, with FailedPrecondition, the requests that g
// does not admit; the exempt methods are always served. Serve tells g the
// instance it registers: the guard of a server made by NewServer is found
// by Serve itself; with ServerOptions, give the same guard to Serve too.
// Without a guard every request is served.
//
// A server made by NewServer needs no WithGuard when Serve registers it in
// the Registry of a lanesenv.Env: Serve then guards it with the Env's
// engine.
func WithGuard(g *Guard) ServerOption {
	return serverOption(func(c *config) { c.guard, c.noGuard = g, false })
}

// WithoutGuard turns off the guard that Serve installs by default in a
// server made by NewServer (see WithGuard): the instance serves every
// request that reaches it, whatever its lane. Give it to NewServer or to
// Serve.
func WithoutGuard() ServerOption {
	return serverOption(func(c *config) { c.guard, c.noGuard = nil, true })
}

// WithInvalidLaneHandler sets a function that the server interceptors call
// for each request that carries an invalid lane (the request is then served
// as a baseline request), for example to count them. The interceptors also
// log such requests, at most once per ten seconds.
func WithInvalidLaneHandler(f func(ctx context.Context, fullMethod string, err *lane.NameError)) ServerOption {
	return serverOption(func(c *config) { c.onInvalid = f })
}

// WithLane sets the lane the instance registers in, for Serve, when the
// instance does not set one (before LANES_LANE).
func WithLane(name string) ServerOption {
	return serverOption(func(c *config) { c.lane = name })
}

// WithTTL sets the lease of Serve's registration (default
// registry.DefaultTTL).
func WithTTL(d time.Duration) ServerOption {
	return serverOption(func(c *config) { c.ttl = d })
}

// WithDrainDelay makes Serve wait, between deregistering the instance and
// stopping the server, for callers to learn that the instance is gone; it
// serves normally meanwhile. Default 0: the lanes picker skips a connection
// that the server's GOAWAY closed, so callers lose no call without it; a
// delay still spares them the reconnection attempts.
func WithDrainDelay(d time.Duration) ServerOption {
	return serverOption(func(c *config) { c.drain = d })
}

// WithShutdownTimeout bounds Serve's graceful stop (default
// DefaultShutdownTimeout); the server is then stopped hard. Zero or
// negative waits for every call in flight.
func WithShutdownTimeout(d time.Duration) ServerOption {
	return serverOption(func(c *config) { c.shutdown = d })
}

// WithEnv sets the function that reads the LANES_* variables (default
// os.Getenv): the caller's zone for NewClient and NewBuilder, the instance
// for Serve.
func WithEnv(getenv func(string) string) Option {
	return option(func(c *config) {
		if getenv != nil {
			c.getenv = getenv
		}
	})
}

// withRefresh sets the resolver's backstop refresh interval (tests).
func withRefresh(d time.Duration) ClientOption {
	return clientOption(func(c *config) { c.refresh = d })
}

// methodSet is a set of full method names and whole services.
type methodSet struct {
	methods  map[string]bool // "/pkg.Svc/Method"
	services map[string]bool // "pkg.Svc"
}

// parseMethods reads WithIdempotent entries. It returns the valid ones and
// an error naming the first invalid one.
func parseMethods(list []string) (methodSet, error) {
	s := methodSet{methods: map[string]bool{}, services: map[string]bool{}}
	var err error
	for _, m := range list {
		svc, meth, ok := splitMethod(m)
		if !ok {
			if err == nil {
				err = fmt.Errorf("lanesgrpc: idempotent method %q: want \"/package.Service/Method\" or \"/package.Service/*\"", m)
			}
			continue
		}
		if meth == "*" {
			s.services[svc] = true
		} else {
			s.methods[m] = true
		}
	}
	return s, err
}

// splitMethod splits "/svc/method" into its parts.
func splitMethod(full string) (svc, method string, ok bool) {
	rest, ok := strings.CutPrefix(full, "/")
	if !ok {
		return "", "", false
	}
	svc, method, ok = strings.Cut(rest, "/")
	if !ok || svc == "" || method == "" || strings.ContainsAny(method, "/") {
		return "", "", false
	}
	return svc, method, true
}

// contains reports whether fullMethod is in the set. It does not allocate.
func (s methodSet) contains(fullMethod string) bool {
	if len(s.methods) == 0 && len(s.services) == 0 {
		return false
	}
	if s.methods[fullMethod] {
		return true
	}
	if len(s.services) > 0 {
		if svc, _, ok := splitMethod(fullMethod); ok {
			return s.services[svc]
		}
	}
	return false
}

func (s methodSet) empty() bool { return len(s.methods) == 0 && len(s.services) == 0 }

// config is what the options set.
type config struct {
	zone       string
	zoneSet    bool
	prop       lane.Propagator
	log        *slog.Logger
	idempotent []string
	health     *string
	dialOpts   []grpc.DialOption
	srvOpts    []grpc.ServerOption
	guard      *Guard
	noGuard    bool // WithoutGuard
	exempt     []string
	onInvalid  func(ctx context.Context, fullMethod string, err *lane.NameError)
	lane       string
	ttl        time.Duration
	drain      time.Duration
	shutdown   time.Duration
	getenv     func(string) string
	refresh    time.Duration
	timeout    time.Duration // response-header timeout setting
	tp         trace.TracerProvider
	metrics    *lanesmetrics.Requests
}

// tracerProvider is the provider of the spans of calls: WithTracerProvider's, else
// lanestrace.TracerProvider(); nil when tracing is off.
func (c *config) tracerProvider() trace.TracerProvider {
	if c.tp != nil {
		return c.tp
	}
	return lanestrace.TracerProvider()
}

// The option types of each role.
type (
	clientOption = roles.Client[config]
	serverOption = roles.Server[config]
	option       = roles.Both[config]
)
