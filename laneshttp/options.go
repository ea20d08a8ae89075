package laneshttp

import (
	"go.opentelemetry.io/otel/trace"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/lanesdev/lanes/internal/lib/guard"
	"github.com/lanesdev/lanes/internal/lib/roles"
	"github.com/lanesdev/lanes/internal/lib/serving"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesmetrics"
	"github.com/lanesdev/lanes/lanestrace"
	"github.com/lanesdev/lanes/routing"
)

// DefaultShutdownTimeout bounds Serve's graceful shutdown unless
// WithShutdownTimeout says otherwise.
const DefaultShutdownTimeout = 30 * time.Second

// DefaultExemptPaths are the paths that the guard never refuses: health and
// metrics endpoints, which are called by the platform, not by lanes callers.
// A path is exempt when it equals one of them or starts with one of them
// followed by "/". WithExemptPaths adds to them.
var DefaultExemptPaths = []string{
	"/healthz", "/_healthz", "/readyz", "/livez", "/startupz", // Kubernetes' convention
	"/health", "/ready", "/live", "/ping", // the unsuffixed forms
	"/metrics", // Prometheus
}

// A ClientOption configures the client side: NewTransport and NewClient.
type ClientOption interface{ ApplyClient(*config) }

// A ServerOption configures the server side: Handler and Serve.
type ServerOption interface{ ApplyServer(*config) }

// An Option configures both sides, and means the same on each:
// WithPropagator, WithZone and WithEnv.
type Option interface {
	ClientOption
	ServerOption
}

func defaults() *config {
	return &config{getenv: os.Getenv, exempt: DefaultExemptPaths, shutdown: DefaultShutdownTimeout, log: slog.Default()}
}

// serving returns the settings of Serve's serving.Run.
func (c *config) serving(name string, stop func() error, closed error) serving.Options {
	return serving.Options{Name: name, Stop: stop, Closed: closed, Lane: c.lane, Zone: c.zone, ZoneSet: c.zoneSet,
		Getenv: c.getenv, TTL: c.ttl, Drain: c.drain, Logger: c.log, Guard: c.guard}
}

func clientConfig(opts []ClientOption) *config { return roles.ClientConfig(defaults(), opts) }

func serverConfig(opts []ServerOption) *config { return roles.ServerConfig(defaults(), opts) }

// WithPropagator sets the propagator that reads the lane (Handler, Serve)
// and writes it (NewTransport, NewClient). The default is the zero
// lane.Propagator: x-lane and baggage, no aliases.
func WithPropagator(p lane.Propagator) Option { return option(func(c *config) { c.prop = p }) }

// WithZone sets the zone. For NewTransport and NewClient it is the caller's
// zone, for same-zone preference (default: LANES_ZONE). For Serve it is the
// instance's zone when the instance does not set one (before LANES_ZONE).
func WithZone(zone string) Option {
	return option(func(c *config) { c.zone, c.zoneSet = zone, true })
}

// WithEnv sets the function that reads LANES_* variables (default
// os.Getenv), for NewTransport's zone and Serve's instance.
func WithEnv(getenv func(string) string) Option {
	return option(func(c *config) {
		if getenv != nil {
			c.getenv = getenv
		}
	})
}

// WithBase sets the transport that sends the routed requests, and the
// requests to other hosts (NewTransport, NewClient). The default, and nil,
// is a clone of http.DefaultTransport that enforces the response-header and
// write timeouts (WithResponseHeaderTimeout, WithWriteTimeout) and, for
// routed requests, refuses to connect to a link-local or cloud metadata
// address (169.254.0.0/16, fe80::/10, fd00:ec2::254, 100.100.100.200: an
// instance address is what whoever registered it chose), checked on the IP
// actually dialled; such an instance is unreachable, and the call moves on.
// A base of your own dials what it dials, and must enforce the timeouts
// itself (for an [http.Transport], set its ResponseHeaderTimeout).
func WithBase(rt http.RoundTripper) ClientOption {
	return clientOption(func(c *config) { c.transport.base = rt })
}

// WithServices sets the function that tells which URL hosts (without port)
// are lanes services (NewTransport, NewClient). The default, and nil, is
// SingleLabel; ServiceNames matches a fixed list.
func WithServices(match func(host string) bool) ClientOption {
	return clientOption(func(c *config) { c.transport.services = match })
}

// WithRefuseOthers makes requests to hosts that are not lanes services fail,
// with an error wrapping ErrNotService, instead of going to the base
// transport (NewTransport, NewClient). By default such requests go to the
// base untouched: no lane is written and none is removed.
func WithRefuseOthers() ClientOption {
	return clientOption(func(c *config) { c.transport.refuseOthers = true })
}

// WithRetries sets how many times a failed attempt may be retried, each time
// on an instance that has not failed the request yet (along the lane chain
// once every eligible instance of the lane has) (NewTransport, NewClient):
// 0 means the default, 1; a negative value turns retries off. Moves past an
// unreachable instance are not retries. See the retry rules in docs/http.md.
func WithRetries(n int) ClientOption {
	return clientOption(func(c *config) { c.transport.call.Retries = n })
}

// WithIdempotent sets the function that tells which requests may be sent
// twice, and so retried after a failure (NewTransport, NewClient). The
// default, and nil, is IsIdempotent.
func WithIdempotent(f func(*http.Request) bool) ClientOption {
	return clientOption(func(c *config) { c.transport.idempotent = f })
}

// WithRetryStatus makes idempotent requests whose response status f accepts
// retried like connection errors (NewTransport, NewClient). The default,
// and nil, retries no status: a 503 is returned to the caller.
func WithRetryStatus(f func(code int) bool) ClientOption {
	return clientOption(func(c *config) { c.transport.retryStatus = f })
}

// WithClassify sets the function that turns the result of one attempt into
// an Outcome for outlier detection (NewTransport, NewClient). The default,
// and nil, is DefaultClassify. Whatever it says, an Ignore for an attempt
// that the caller abandoned after the instance had taken longer than the
// response-header timeout counts as a Failure.
func WithClassify(f func(req *http.Request, res *http.Response, err error) Outcome) ClientOption {
	return clientOption(func(c *config) { c.transport.classify = f })
}

// WithReadyTimeout bounds the wait for the registry to list a service's
// instances when a request is the first to the service, with an engine
// that follows a registry (NewTransport, NewClient). 0 means
// DefaultReadyTimeout; a negative value does not wait. After the wait, the
// request is routed on what the engine knows.
func WithReadyTimeout(d time.Duration) ClientOption {
	return clientOption(func(c *config) { c.transport.readyTimeout = d })
}

// WithResponseHeaderTimeout bounds how long an instance may take to send the
// response headers of an attempt (NewTransport, NewClient): the attempt
// then fails, counts as a failure for outlier detection (and ejects the
// instance at once: it hangs), and an idempotent request is retried on
// another instance; an attempt that the caller abandons after that long
// counts as a failure too. 0 means DefaultResponseHeaderTimeout; a negative
// value sets no timeout. The default base enforces it; a base of your own
// must enforce it itself.
func WithResponseHeaderTimeout(d time.Duration) ClientOption {
	return clientOption(func(c *config) { c.transport.call.ResponseHeaderTimeout = d })
}

// WithWriteTimeout bounds each write of a request to an instance, its head
// and each part of its body as it is sent (NewTransport, NewClient): an
// instance that takes none of a write for that long (hung, paused with
// SIGSTOP, or not reading an upload) fails the attempt, which counts as a
// failure for outlier detection and is retried on another instance when
// the request may be (an idempotent one whose body can be sent again). It
// bounds the time between two writes the instance takes, as nginx's
// proxy_send_timeout does, not the whole upload; a write may fail up to a
// tenth of it (at most a second) sooner. 0 means DefaultWriteTimeout; a
// negative value sets no timeout. The default base enforces it; a base of
// your own must enforce it itself.
func WithWriteTimeout(d time.Duration) ClientOption {
	return clientOption(func(c *config) { c.transport.writeTimeout = d })
}

// WithTracerProvider traces requests with tp: the Transport writes a client span per request
// with its routing decision (and the W3C traceparent header), and Handler runs otelhttp's handler
// around the lanes middleware, whose server span gets the lane received, the instance's own lane
// and the guard's verdict (see docs/tracing.md). The default is lanestrace.TracerProvider(),
// which lanestrace.FromEnv sets; with neither, requests are not traced and cost nothing more.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return option(func(c *config) { c.tp = tp })
}

// WithMetrics counts every request's routing decision in m (lanes_requests_total by service,
// requested lane, served lane and reason; see lanesmetrics).
func WithMetrics(m *lanesmetrics.Requests) ClientOption {
	return clientOption(func(c *config) { c.transport.call.Metrics = m })
}

// tracerProvider is WithTracerProvider's provider, else lanestrace's; nil when tracing is off.
func (c *config) tracerProvider() trace.TracerProvider {
	if c.tp != nil {
		return c.tp
	}
	return lanestrace.TracerProvider()
}

// WithLogger sets the logger of Handler and Serve (default slog.Default()).
func WithLogger(l *slog.Logger) ServerOption {
	return serverOption(func(c *config) {
		if l != nil {
			c.log = l
		}
	})
}

// A Guard is the provider-side check of an instance registered in a lane:
// it refuses the requests whose lane chain does not contain the instance's
// lane (routing.Engine.Admits). It is the same guard as lanesgrpc's. Make
// one with NewGuard and give it to Serve or Handler with WithGuard.
type Guard = guard.Guard

// NewGuard returns a guard that follows the policy of e, which must not be
// nil: the instance's effective lane (after dynamic tag rules) and the
// fallback chains. Serve tells it the instance it guards; with Handler
// alone, tell it with Guard.SetInstance.
func NewGuard(e *routing.Engine) *Guard { return guard.New(e) }

// WithGuard installs the guard g (Handler, Serve): a lane instance refuses,
// with 421 Misdirected Request, the requests whose lane chain does not
// include its lane; the exempt paths are always served. Serve tells g the
// instance it registers. Without a guard every request is served.
//
// Serve needs no WithGuard when it registers in the Registry of a
// lanesenv.Env: it then guards the instance with the Env's engine.
func WithGuard(g *Guard) ServerOption {
	return serverOption(func(c *config) { c.guard, c.noGuard = g, false })
}

// WithoutGuard turns off the guard that Serve installs by default (see
// WithGuard): the instance serves every request that reaches it, whatever
// its lane.
func WithoutGuard() ServerOption {
	return serverOption(func(c *config) { c.guard, c.noGuard = nil, true })
}

// WithExemptPaths adds paths that the guard never refuses to
// DefaultExemptPaths (Handler, Serve). A path is exempt when it equals one
// of them, or starts with one of them followed by "/".
func WithExemptPaths(paths ...string) ServerOption {
	return serverOption(func(c *config) { c.exempt = append(slices.Clip(c.exempt), paths...) })
}

// WithLane sets the instance's lane for Serve, when the instance does not set
// one (before LANES_LANE).
func WithLane(name string) ServerOption { return serverOption(func(c *config) { c.lane = name }) }

// WithTTL sets the lease TTL of Serve's registration (default
// registry.DefaultTTL).
func WithTTL(d time.Duration) ServerOption { return serverOption(func(c *config) { c.ttl = d }) }

// WithDrainDelay makes Serve wait, between deregistering the instance and
// shutting the server down, for callers to learn that the instance is gone;
// it serves normally meanwhile. Default 0. A second or two suits a registry
// on etcd.
func WithDrainDelay(d time.Duration) ServerOption {
	return serverOption(func(c *config) { c.drain = d })
}

// WithShutdownTimeout bounds Serve's graceful shutdown (default
// DefaultShutdownTimeout); the server is then closed.
func WithShutdownTimeout(d time.Duration) ServerOption {
	return serverOption(func(c *config) { c.shutdown = d })
}

// config is what the options set.
type config struct {
	// client
	transport Transport // the engine, the propagator, the zone, the host and the tracer are filled in by NewTransport
	zone      string
	zoneSet   bool

	// both
	prop   lane.Propagator
	getenv func(string) string
	tp     trace.TracerProvider

	// server
	log      *slog.Logger
	guard    *Guard
	noGuard  bool // WithoutGuard
	exempt   []string
	lane     string
	ttl      time.Duration
	drain    time.Duration
	shutdown time.Duration
}

// The option types of each role.
type (
	clientOption = roles.Client[config]
	serverOption = roles.Server[config]
	option       = roles.Both[config]
)
