package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lanesdev/lanes/internal/lib/accept"
	"github.com/lanesdev/lanes/internal/lib/addrpolicy"
	"github.com/lanesdev/lanes/internal/lib/routedcall"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/routing"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// Defaults of Config.
const (
	DefaultLaneCookie          = "lane"
	DefaultKeyHeader           = "x-lanes-key"
	DefaultKeyCookie           = "lanes-key"
	DefaultMaxIdleConnsPerHost = 512
	DefaultReadyTimeout        = 5 * time.Second
	// DefaultUpstreamWriteTimeout is how long an instance may take to take
	// each write of a request (Config.UpstreamWriteTimeout).
	DefaultUpstreamWriteTimeout = 10 * time.Second
	// DefaultUpstreamReadTimeout is how long an instance may send nothing
	// of an answer's body (Config.UpstreamReadTimeout), as nginx's
	// proxy_read_timeout.
	DefaultUpstreamReadTimeout = 60 * time.Second
	// DefaultClientWriteTimeout is how long a client may take none of a
	// write of an answer (Config.ClientWriteTimeout), as nginx's
	// send_timeout.
	DefaultClientWriteTimeout = 60 * time.Second
	// DefaultUpstreamIdleTimeout is how long a keep-alive connection to an
	// instance is kept idle (Config.UpstreamIdleTimeout), as net/http's
	// DefaultTransport keeps one.
	DefaultUpstreamIdleTimeout = 90 * time.Second
	// DefaultClientIdleTimeout is how long a client's keep-alive connection
	// may wait for its next request (Config.ClientIdleTimeout).
	DefaultClientIdleTimeout = 2 * time.Minute
	// DefaultClientHeaderTimeout is how long a client may take to send a
	// request's head (Config.ClientHeaderTimeout).
	DefaultClientHeaderTimeout = 10 * time.Second
	// DefaultClientReadTimeout is how long a client may send nothing of a
	// request's body (Config.ClientReadTimeout).
	DefaultClientReadTimeout = 2 * time.Minute
	// DefaultRetries is how many times a routed call is tried again on
	// another instance (Config.Retries).
	DefaultRetries = routedcall.DefaultRetries
	// MaxConnsCeiling is the most that DefaultMaxConns gives.
	MaxConnsCeiling = 10000
)

// DefaultMaxConns is the cap on the client connections open at once that
// Config.MaxConns 0 means: a quarter of the process's open-file limit
// (RLIMIT_NOFILE), at most MaxConnsCeiling. The quarter leaves room for
// the gateway's connections to instances, which may be as many, and for the
// other listeners and files of the process.
func DefaultMaxConns() int { return accept.Share(4, MaxConnsCeiling) }

// MaxHeaderBytes is the MaxHeaderBytes of the gateway's net/http servers: the
// same bound on a request head for every net/http server of lanes that takes
// requests from clients (the sidecar's listeners).
const MaxHeaderBytes = stdMaxHeaderBytes

// Config is what a Gateway needs. Engine is required.
type Config struct {
	// Engine routes every request. The gateway does not close it.
	Engine *routing.Engine
	// Routes map hosts and path prefixes to services: a route on the
	// request's host before one without a host, then the longest prefix.
	// Without routes every request gets 404 no_route.
	Routes []Route
	// Domain, when set, makes <lane>.<Domain> hosts lane hosts, for example
	// "lanes.localhost" for alice.lanes.localhost.
	Domain string
	// TrustedProxies are the peers whose X-Forwarded-For is believed.
	TrustedProxies []netip.Prefix
	// Claims returns the lane that a client address is claimed for, if any
	// (the dynamic claims of `lanes dev`). It is called for requests that no
	// earlier source put in a lane, and must be safe for concurrent use and
	// fast. Nil: no dynamic claims.
	Claims func(netip.Addr) (lane string, ok bool)
	// Zone is the gateway's zone, for the engine's zone preference.
	Zone string
	// Host is the gateway's host, for the same-host rule of the policy's
	// locality.host; default registry.LocalHost (LANES_HOST, else the
	// machine's host name).
	Host string
	// Logger receives the gateway's warnings; default slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets the gateway's Prometheus counters.
	Registerer prometheus.Registerer
	// Dial are the rules of the addresses that the gateway connects to
	// (internal/lib/addrpolicy), checked on the IP and port of every
	// connection to an instance, after resolution, on either HTTP/1.1 stack
	// and h2c: the control plane's own listeners (Dial.Reserved) and, unless
	// Dial.LinkLocal, link-local and cloud metadata addresses are refused
	// before any byte is sent, whatever the registry holds. A refused dial
	// is an unreachable instance: the call moves on to another. Nil: the
	// zero rules (no reserved listener known; link-local refused).
	Dial *addrpolicy.Rules

	// Aliases are more headers to read the lane from after x-lane and
	// baggage (see lane.Propagator); they are always removed upstream.
	Aliases []string
	// LaneCookie names the lane cookie; default "lane".
	LaneCookie string
	// KeyHeader and KeyCookie name where the request key of canary splits
	// is read, the header first; defaults "x-lanes-key" and "lanes-key".
	KeyHeader string
	KeyCookie string
	// Disable turns lane-assignment sources off.
	Disable []Source
	// PreserveHost sends the client's Host header upstream instead of the
	// instance's address.
	PreserveHost bool
	// MaxIdleConnsPerHost bounds the idle keep-alive connections kept to
	// each instance; 0 means DefaultMaxIdleConnsPerHost (512); negative is
	// refused.
	MaxIdleConnsPerHost int
	// Retries is how many times a routed call that failed after it was
	// sent is tried again on another instance (see the package
	// documentation: an idempotent request without a body). 0 means
	// DefaultRetries (1); negative: none.
	Retries int
	// ReadyTimeout bounds how long the first requests wait for the engine
	// to have read the policy and a service's instances. 0 means
	// DefaultReadyTimeout (5s); negative: no bound (a request waits as long
	// as its client does).
	ReadyTimeout time.Duration
	// ResponseHeaderTimeout bounds how long an instance may take to send
	// the response headers of an HTTP/1.1 request, from the end of the
	// request's write (an upload may take longer): the attempt then fails
	// with 502 (or is retried, see the package documentation) and counts
	// as a failure for outlier detection, as does a call that the client
	// abandons after the instance took that long. gRPC calls, whose streams
	// may rightly wait long for their first message, are not cut, but an
	// h2c connection that answers no ping within it is closed, which fails
	// its calls (a paused instance). 0 means
	// laneshttp.DefaultResponseHeaderTimeout (10s); negative: none.
	ResponseHeaderTimeout time.Duration
	// UpstreamWriteTimeout bounds each write of an HTTP/1.1 request to an
	// instance (the head, and each part of a body as it streams): an
	// instance that takes none of it for that long (hung, paused, or not
	// reading an upload) fails the attempt, which counts as a failure for
	// outlier detection; the client gets 502 upstream (a request without a
	// body may be retried, see the package documentation). It bounds the
	// time between two writes that the instance takes, not the whole
	// upload, which lasts as long as the client and the instance keep it
	// going. An h2c connection (gRPC) on which nothing can be written for
	// that long is closed. 0 means DefaultUpstreamWriteTimeout (10s);
	// negative: none.
	UpstreamWriteTimeout time.Duration
	// UpstreamReadTimeout bounds the wait for each read of the body of an
	// HTTP/1.1 answer from an instance, once its head is in, as nginx's
	// proxy_read_timeout: an instance that sends nothing of the body for
	// that long (hung, or paused, in the middle of it) has the answer cut.
	// Its head has gone to the client, whose connection is then closed
	// without a valid end of the body (the client sees a broken answer,
	// never a whole one); the instance is reported failing (outlier
	// detection) and the gateway logs it. It bounds the time between two
	// reads, not the whole answer, which streams as long as the instance
	// keeps sending; but a stream that stays silent longer (a long poll,
	// server-sent events without heartbeats) needs it raised, or off. On
	// the fast stack a small body of known length is read whole before its
	// head goes to the client: there the attempt fails with 502 upstream,
	// as any other attempt without an answer. gRPC calls are not bounded by
	// it. 0 means DefaultUpstreamReadTimeout (60s); negative: none.
	UpstreamReadTimeout time.Duration
	// ClientWriteTimeout bounds each write of an answer to a client, on
	// the connections that Serve accepts (HTTP/1.1 on either stack, and
	// h2c), as nginx's send_timeout: a client that takes none of a write
	// for that long (it stopped reading, or is gone without a word) has its
	// connection closed, which ends the call and frees the instance's
	// connection. It bounds the time between two writes the client takes,
	// not the whole answer, which streams as long as the client reads.
	// (Neither server's own WriteTimeout is set: both are a deadline for
	// the whole answer, which would cut long streams.) A server of your own
	// that serves the gateway as an http.Handler is not bounded by it. 0
	// means DefaultClientWriteTimeout (60s); negative: none.
	ClientWriteTimeout time.Duration
	// UpstreamIdleTimeout is how long a keep-alive connection to an
	// instance is kept while no request uses it, on either HTTP/1.1 stack and
	// to h2c instances, as nginx's keepalive_timeout in an upstream block:
	// set it below the instances' own idle timeout, so that the gateway,
	// not the instance, closes an idle connection and no request is sent
	// on one the instance is closing. The fast stack also forgets an
	// instance it has not sent a request to for that long. 0 means
	// DefaultUpstreamIdleTimeout (90s); negative: none (an idle connection
	// is kept until the instance closes it).
	UpstreamIdleTimeout time.Duration
	// ClientIdleTimeout is how long a client's keep-alive connection
	// (HTTP/1.1 on either stack, and h2c) may wait for its next request
	// before the gateway closes it, as nginx's keepalive_timeout. 0 means
	// DefaultClientIdleTimeout (2m); negative: none.
	ClientIdleTimeout time.Duration
	// ClientHeaderTimeout bounds how long a client may take to send a
	// request's head (the request line and the header fields), on both
	// HTTP/1.1 paths, from the connection's open for its first request
	// and from the first byte of each next one (the client idle timeout
	// bounds the wait for it), as nginx's client_header_timeout: a client
	// that sends a partial head and stops has its connection closed, with
	// 408 on the fast stack. 0 means DefaultClientHeaderTimeout (10s);
	// negative: none.
	ClientHeaderTimeout time.Duration
	// ClientReadTimeout bounds each read of a request's body from an
	// HTTP/1.x client, on both stacks, as nginx's client_body_timeout: a
	// client that sends nothing of its body for that long gets 400
	// bad_request_body and its connection is closed (the instance is not
	// blamed). It bounds the time between two reads, not the whole upload,
	// which lasts as long as the client keeps sending. On the fast stack a
	// small body (up to 16 KiB, with a length) is read whole with the head,
	// within it too. HTTP/2 request bodies (gRPC streams) are not bounded
	// by it. 0 means DefaultClientReadTimeout (2m); negative: none.
	ClientReadTimeout time.Duration
	// MaxConns caps the client connections open at once on a listener
	// that Serve serves (HTTP/1.1 on either stack, and h2c): a connection
	// over it is answered 503 with x-lanes-error: overloaded and
	// Connection: close, at once, and closed; it is counted in
	// lanes_gateway_errors_total{code="overloaded"} and logged (at most
	// one line every 10s). 0 means DefaultMaxConns(); negative is refused.
	MaxConns int
	// HTTP1 chooses the stack that serves HTTP/1.1 requests: HTTP1Fast
	// (the default, "fast") or HTTP1Std ("std"); see the package
	// documentation. HTTP/2 is served by net/http on both.
	HTTP1 string
	// Tracer, when set, traces every request: a server span that starts its trace (the entry,
	// sampled by the lane the gateway assigned; see lanestrace.Sampler), a client span per
	// upstream call with its routing decision, and the trace id in the answer (x-trace-id and
	// W3C traceresponse).
	Tracer trace.Tracer
}

// The values of Config.HTTP1.
const (
	// HTTP1Fast serves HTTP/1.1 on fasthttp, with the gateway's own
	// upstream keep-alive pools.
	HTTP1Fast = "fast"
	// HTTP1Std serves HTTP/1.1 on net/http, with httputil.ReverseProxy
	// and net/http's transport.
	HTTP1Std = "std"
)

// Gateway is the lanes edge proxy. Serve it with Gateway.Serve (HTTP/1.1 on
// the stack that Config.HTTP1 chooses, and h2c), or, as an http.Handler (the
// net/http stack), with a server of your own that enables unencrypted HTTP/2
// for gRPC. Close it when done.
type Gateway struct {
	settings
	engine   *routing.Engine
	routes   []route
	domain   string
	trusted  []netip.Prefix
	claims   func(netip.Addr) (string, bool)
	zone     string
	prop     lane.Propagator
	aliases  []string // canonical header keys
	stripped []string // header names never sent upstream as the client spelled them
	preserve bool
	on       sourceSet // the sources that Config.Disable leaves on
	// shedAnswer is what a connection over maxConns is answered.
	shedAnswer []byte
	tracer     trace.Tracer

	view atomic.Pointer[policyView]
	m    *metrics
	// std is the net/http stack: HTTP/2 (h2c, gRPC, TLS) on every
	// gateway, the http.Handler (ServeHTTP), and HTTP/1.1 with
	// Config.HTTP1 std. http1 is the stack that Serve serves HTTP/1.1 on:
	// std, or a fastStack over it. stacks are the gateway's stacks, in the
	// order that Shutdown and Close stop them: http1 first.
	std    *stdStack
	http1  stack
	stacks []stack

	// lifecycle
	closing  atomic.Bool
	inflight atomic.Int64
	drained  chan struct{}
	drainOne sync.Once
}

// New validates cfg (see Config.Validate) and returns a gateway. It asks the
// engine for every routed service at once, so that an engine following a
// registry starts watching them.
func New(cfg Config) (*Gateway, error) {
	if cfg.Engine == nil {
		return nil, fieldError("engine", -1, "nil; the gateway routes through a routing.Engine")
	}
	g, err := compile(cfg)
	if err != nil {
		return nil, err
	}
	g.engine = cfg.Engine
	g.call.Engine = cfg.Engine
	g.m, err = newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	g.shedAnswer = shedAnswer(g.maxConns)
	g.tracer = cfg.Tracer
	g.std = newStdStack(g, cfg.Dial)
	g.http1, g.stacks = g.std, []stack{g.std}
	if g.fast {
		f := newFastStack(g, g.std, cfg.Dial)
		g.http1, g.stacks = f, []stack{f, g.std}
	}
	for i := range g.routes {
		g.routes[i].svc = g.engine.Service(g.routes[i].Service)
	}
	return g, nil
}

// validHeader reports whether s is a token (RFC 9110), as header and cookie
// names must be.
func validHeader(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
		if !ok {
			return false
		}
	}
	return true
}

// Serve accepts connections on ln and serves the gateway on them, with
// HTTP/1.1 and HTTP/2 without TLS (prior knowledge, as gRPC clients speak
// it). HTTP/1.1 is served on the stack that Config.HTTP1 chooses; a
// connection that opens with the HTTP/2 preface goes to net/http whichever
// it is. It returns http.ErrServerClosed after Close or Shutdown.
//
// Serve accepts through internal/lib/accept: a temporary accept error (out
// of file descriptors) is waited out, and the open connections are capped
// at Config.MaxConns, a connection over it answered with shedAnswer.
func (g *Gateway) Serve(ln net.Listener) error {
	return g.http1.serve(g.accepting(ln))
}

// ServeHTTP routes one request on the net/http stack: it finds the route,
// assigns the lane, picks an instance through the engine and proxies the
// request to it.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) { g.std.ServeHTTP(w, r) }

// Shutdown stops the servers that Serve started gracefully, as
// http.Server.Shutdown does, and waits for every request in flight through
// the gateway to end, or for ctx. When ctx ends first it closes what is
// left, as Close does, and returns ctx's error.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.closing.Store(true)
	var errs []error
	for _, s := range g.stacks {
		if err := s.shutdown(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		g.Close()
		return errors.Join(errs...)
	}
	g.checkDrained()
	select {
	case <-g.drained:
	case <-ctx.Done():
		g.Close()
		return ctx.Err()
	}
	for _, s := range g.stacks {
		s.release(ctx)
	}
	return ctx.Err()
}

// Close closes the servers that Serve started and their connections, and
// the connections to instances in use, which cancels their requests (an
// instance that stalls in the middle of an answer holds none of them),
// waits for every request in flight through the gateway to end, stops
// what the stacks started and closes the idle connections to instances.
// Requests that arrive later get 503. The engine is left open. Close a
// server of your own that serves the gateway before calling Close.
func (g *Gateway) Close() error {
	g.closing.Store(true)
	var errs []error
	for _, s := range g.stacks {
		if err := s.close(); err != nil {
			errs = append(errs, err)
		}
	}
	g.checkDrained()
	<-g.drained
	now, cancel := context.WithCancel(context.Background())
	cancel() // what is left is closed at once
	for _, s := range g.stacks {
		s.release(now)
	}
	return errors.Join(errs...)
}

// enter counts a request in; it fails once the gateway is closing.
func (g *Gateway) enter() bool {
	if g.closing.Load() {
		return false
	}
	g.inflight.Add(1)
	if g.closing.Load() {
		g.exit()
		return false
	}
	return true
}

func (g *Gateway) exit() {
	if g.inflight.Add(-1) == 0 && g.closing.Load() {
		g.drainOne.Do(func() { close(g.drained) })
	}
}

func (g *Gateway) checkDrained() {
	if g.inflight.Load() == 0 {
		g.drainOne.Do(func() { close(g.drained) })
	}
}

// policyView returns the compiled view of the policy in force.
func (g *Gateway) policyView() *policyView {
	p := g.engine.Policy()
	if v := g.view.Load(); v != nil && v.src == p {
		return v
	}
	v := compilePolicy(p)
	g.view.Store(v)
	return v
}

// match returns the route for host and path, or nil: among the routes on
// host, else among those without a host, the one with the longest prefix
// that matches path (as net/http.ServeMux and nginx choose), whatever the
// order they were given in. Routes with the same host and prefix are
// refused (validateRoutes), so the choice is unique.
func (g *Gateway) match(host, path string) *route {
	var best *route
	for i := range g.routes {
		r := &g.routes[i]
		if r.Host != "" && !strings.EqualFold(r.Host, host) {
			continue
		}
		if r.Prefix != "" && !matchPath(path, r.prefix) {
			continue
		}
		if best == nil || betterRoute(r, best) {
			best = r
		}
	}
	return best
}
