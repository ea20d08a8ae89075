package laneshttp

import (
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// DefaultShutdownTimeout bounds Serve's graceful shutdown unless
// WithShutdownTimeout says otherwise.
const DefaultShutdownTimeout = 30 * time.Second

// DefaultExemptPaths are the paths that the guard never refuses: health and
// metrics endpoints, which are called by the platform, not by lanes callers.
// A path is exempt when it equals one of them or starts with one of them
// followed by "/".
var DefaultExemptPaths = []string{"/healthz", "/readyz", "/livez", "/metrics"}

// An Option configures NewTransport and NewClient (client options), or
// Handler and Serve (server options). Each option says which it applies to;
// the others ignore it.
type Option func(*config)

type config struct {
	// client
	transport Transport // Engine and Propagator are filled in by NewTransport
	zone      string
	zoneSet   bool

	// both
	prop   lane.Propagator
	getenv func(string) string

	// server
	log      *slog.Logger
	engine   *routing.Engine
	guardIn  *registry.Instance
	noGuard  bool
	exempt   []string
	lane     string
	ttl      time.Duration
	drain    time.Duration
	shutdown time.Duration
}

func newConfig(opts []Option) *config {
	c := &config{getenv: os.Getenv, exempt: DefaultExemptPaths, shutdown: DefaultShutdownTimeout}
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	return c
}

// WithPropagator sets the propagator that reads the lane (Handler, Serve)
// and writes it (NewTransport, NewClient). The default is the zero
// lane.Propagator: x-lane and baggage, no aliases.
func WithPropagator(p lane.Propagator) Option { return func(c *config) { c.prop = p } }

// WithZone sets the zone. For NewTransport and NewClient it is the caller's
// zone, for same-zone preference (default: LANES_ZONE). For Serve it is the
// instance's zone when the instance does not set one (before LANES_ZONE).
func WithZone(zone string) Option {
	return func(c *config) { c.zone, c.zoneSet = zone, true }
}

// WithEnv sets the function that reads LANES_* variables (default
// os.Getenv), for NewTransport's zone and Serve's instance.
func WithEnv(getenv func(string) string) Option {
	return func(c *config) {
		if getenv != nil {
			c.getenv = getenv
		}
	}
}

// WithBase sets the transport that sends the routed requests and the
// requests to other hosts (NewTransport, NewClient). Default:
// http.DefaultTransport.
func WithBase(rt http.RoundTripper) Option { return func(c *config) { c.transport.Base = rt } }

// WithServices sets the function that tells which URL hosts are lanes
// services (NewTransport, NewClient); see Transport.Services.
func WithServices(match func(host string) bool) Option {
	return func(c *config) { c.transport.Services = match }
}

// WithRefuseOthers makes requests to hosts that are not lanes services fail
// instead of going to the base transport (NewTransport, NewClient).
func WithRefuseOthers() Option { return func(c *config) { c.transport.RefuseOthers = true } }

// WithRetries sets how many times a failed attempt may be retried on another
// instance (NewTransport, NewClient): 0 means the default, 1; a negative
// value turns retries off.
func WithRetries(n int) Option { return func(c *config) { c.transport.Retries = n } }

// WithIdempotent sets the function that tells which requests may be retried
// after a connection error (NewTransport, NewClient); default IsIdempotent.
func WithIdempotent(f func(*http.Request) bool) Option {
	return func(c *config) { c.transport.Idempotent = f }
}

// WithRetryStatus makes idempotent requests whose response status f accepts
// retried like connection errors (NewTransport, NewClient). Default: none.
func WithRetryStatus(f func(code int) bool) Option {
	return func(c *config) { c.transport.RetryStatus = f }
}

// WithClassify sets the function that turns an attempt into an Outcome for
// outlier detection (NewTransport, NewClient); default DefaultClassify.
func WithClassify(f func(req *http.Request, res *http.Response, err error) Outcome) Option {
	return func(c *config) { c.transport.Classify = f }
}

// WithReadyTimeout sets Transport.ReadyTimeout (NewTransport, NewClient).
func WithReadyTimeout(d time.Duration) Option {
	return func(c *config) { c.transport.ReadyTimeout = d }
}

// WithResponseHeaderTimeout sets Transport.ResponseHeaderTimeout
// (NewTransport, NewClient): how long an instance may take to send the
// response headers (default DefaultResponseHeaderTimeout; negative: none).
func WithResponseHeaderTimeout(d time.Duration) Option {
	return func(c *config) { c.transport.ResponseHeaderTimeout = d }
}

// WithLogger sets the logger of Handler and Serve (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// WithGuard turns on the provider-side guard of Handler for the instance
// inst, as registered: a lane instance refuses, with 421 Misdirected Request,
// the requests whose lane chain does not include its lane (see
// routing.Engine.Admits). The engine supplies the policy: the instance's
// effective lane (after dynamic tag rules) and the fallback chains. Serve
// sets it up itself from WithEngine.
func WithGuard(e *routing.Engine, inst registry.Instance) Option {
	return func(c *config) {
		c.engine = e
		in := inst.Clone()
		c.guardIn = &in
	}
}

// WithEngine gives Serve the engine whose policy the guard follows. Without
// it, Serve cannot guard (it logs so) since fallback chains and dynamic tag
// rules live in the policy.
func WithEngine(e *routing.Engine) Option { return func(c *config) { c.engine = e } }

// WithoutGuard turns the guard off (Handler, Serve).
func WithoutGuard() Option { return func(c *config) { c.noGuard = true } }

// WithExemptPaths replaces DefaultExemptPaths: the paths that the guard
// never refuses (Handler, Serve). A path is exempt when it equals one of
// them, or starts with one of them followed by "/".
func WithExemptPaths(paths ...string) Option {
	return func(c *config) { c.exempt = append([]string(nil), paths...) }
}

// WithLane sets the instance's lane for Serve, when the instance does not set
// one (before LANES_LANE).
func WithLane(name string) Option { return func(c *config) { c.lane = name } }

// WithTTL sets the lease TTL of Serve's registration (default
// registry.DefaultTTL).
func WithTTL(d time.Duration) Option { return func(c *config) { c.ttl = d } }

// WithDrainDelay makes Serve wait, between deregistering the instance and
// shutting the server down, for callers to learn that the instance is gone;
// it serves normally meanwhile. Default 0. A second or two suits a registry
// on etcd.
func WithDrainDelay(d time.Duration) Option { return func(c *config) { c.drain = d } }

// WithShutdownTimeout bounds Serve's graceful shutdown (default
// DefaultShutdownTimeout); the server is then closed.
func WithShutdownTimeout(d time.Duration) Option { return func(c *config) { c.shutdown = d } }
