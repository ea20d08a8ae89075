package laneshttp

import (
	"context"
	"errors"
	"fmt"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/lanesdev/lanes/internal/lib/addrpolicy"
	"github.com/lanesdev/lanes/internal/lib/netbound"
	"github.com/lanesdev/lanes/internal/lib/routedcall"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesmetrics"
	"github.com/lanesdev/lanes/lanestrace"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// DefaultReadyTimeout is how long a Transport waits, at most, for the
// registry to list a service's instances the first time the service is
// called (see Transport.ReadyTimeout).
const DefaultReadyTimeout = 10 * time.Second

// DefaultResponseHeaderTimeout is how long an instance may take to send the
// response headers before the attempt fails (see
// Transport.ResponseHeaderTimeout).
const DefaultResponseHeaderTimeout = routedcall.DefaultResponseHeaderTimeout

// DefaultWriteTimeout is how long an instance may take to take any of a
// write of a request (its head, or a part of its body) before the attempt
// fails (see Transport.WriteTimeout).
const DefaultWriteTimeout = 10 * time.Second

// ErrNotService is wrapped by the error that a Transport with RefuseOthers
// returns for a host that is not a lanes service.
var ErrNotService = errors.New("laneshttp: not a lanes service")

// Outcome is what one attempt says about the health of the instance that
// served it, for outlier detection: Ignore, Success, Failure or
// Unreachable.
type Outcome = routedcall.Outcome

const (
	// Ignore reports nothing: the attempt says nothing about the instance
	// (for example, the caller gave up).
	Ignore = routedcall.Ignore
	// Success reports the instance healthy.
	Success = routedcall.Success
	// Failure reports a failure, which counts towards ejection.
	Failure = routedcall.Failure
	// Unreachable reports that the request never reached the instance (the
	// connection was refused, the dial failed): the instance is marked
	// failing at once (ejected), and the request moves on to another
	// instance, or along the lane's fallback chain, whatever its method.
	Unreachable = routedcall.Unreachable
)

// Transport is an [http.RoundTripper] that routes requests to lanes services
// through a routing engine. See the package documentation.
//
// Only Engine is required. A Transport is safe for concurrent use; do not
// change its fields once it is in use.
type Transport struct {
	// Engine routes the requests. Required.
	Engine *routing.Engine

	// Tracer, when set, writes a client span for each routed request, with its routing
	// decision (see docs/tracing.md), and the W3C traceparent header of the span. NewTransport
	// sets it from WithTracerProvider or lanestrace.TracerProvider().
	Tracer trace.Tracer

	// Metrics, when set, counts every routed request's decision (WithMetrics).
	Metrics *lanesmetrics.Requests

	// Base sends the requests once routed, and the requests to other hosts.
	// nil means a clone of http.DefaultTransport, which for routed
	// requests refuses to connect to a link-local or cloud metadata
	// address (169.254.0.0/16, fe80::/10, fd00:ec2::254, 100.100.100.200:
	// an instance address is what whoever registered it chose), checked on
	// the IP actually dialled; such an instance is unreachable, and the
	// call moves on. A Base of your own dials what it dials.
	Base http.RoundTripper

	// Zone is the caller's zone, for same-zone preference ("" when unknown).
	Zone string

	// Host is the caller's host, for the same-host rule of the policy's
	// locality.host ("" when unknown). NewTransport sets it to
	// registry.LocalHost: LANES_HOST, else the machine's host name.
	Host string

	// Propagator writes the lane to outgoing requests. Its Aliases are
	// removed from baseline requests.
	Propagator lane.Propagator

	// Services reports whether a URL host (without port) is a lanes service.
	// nil means SingleLabel.
	Services func(host string) bool

	// RefuseOthers makes RoundTrip fail, with an error wrapping
	// ErrNotService, for a host that is not a lanes service. By default such
	// requests go to Base untouched: no lane is written and none is removed.
	RefuseOthers bool

	// Retries is how many times a failed attempt may be retried, each time
	// on an instance that has not failed this request yet (along the lane
	// chain once every eligible instance of the lane has). 0 means 1; a
	// negative value turns retries off. See the retry rules in docs/http.md.
	Retries int

	// Idempotent reports whether a request may be retried after a connection
	// error. nil means IsIdempotent.
	Idempotent func(*http.Request) bool

	// RetryStatus reports whether a response status of an idempotent request
	// is retried like a connection error. nil means none: a 503 is returned
	// to the caller, not retried.
	RetryStatus func(code int) bool

	// Classify turns the result of one attempt into an Outcome for outlier
	// detection. nil means DefaultClassify. Whatever it says, an Ignore for
	// an attempt that the caller abandoned after the instance had taken
	// longer than ResponseHeaderTimeout counts as a Failure.
	Classify func(req *http.Request, res *http.Response, err error) Outcome

	// ResponseHeaderTimeout bounds how long an instance may take to send
	// the response headers of an attempt: the attempt then fails, counts as
	// a failure for outlier detection, and an idempotent request is retried
	// on another instance; an attempt that the caller abandons after that
	// long counts as a failure too. 0 means DefaultResponseHeaderTimeout; a
	// negative value sets no timeout. The Transport's default base enforces
	// it; a Base of your own must enforce it itself (for an
	// [http.Transport], set its ResponseHeaderTimeout).
	ResponseHeaderTimeout time.Duration

	// WriteTimeout bounds each write of a request to an instance (its head,
	// and each part of its body as it is sent): an instance that takes none
	// of a write for that long (hung, paused with SIGSTOP, or not reading an
	// upload) fails the attempt, which counts as a failure for outlier
	// detection and is retried on another instance when the request may be
	// (an idempotent one whose body can be sent again). It bounds the time
	// between two writes the instance takes, as nginx's proxy_send_timeout
	// does, not the whole upload; a write may fail up to a tenth of it (at
	// most a second) sooner. 0 means DefaultWriteTimeout; a negative value
	// sets no timeout. The Transport's default base enforces it; a Base of
	// your own must enforce it itself.
	WriteTimeout time.Duration

	// ReadyTimeout bounds the wait for the registry to list a service's
	// instances when a request is the first to the service (only with an
	// engine that follows a registry). 0 means DefaultReadyTimeout; a
	// negative value does not wait. After the wait, the request is routed on
	// what the engine knows.
	ReadyTimeout time.Duration
}

// NewTransport returns a Transport on the engine e, configured by the client
// options: WithBase, WithZone, WithPropagator, WithServices,
// WithRefuseOthers, WithRetries, WithIdempotent, WithRetryStatus,
// WithClassify, WithReadyTimeout, WithResponseHeaderTimeout and
// WithWriteTimeout. Without
// WithZone, the zone is read from LANES_ZONE. The host is this process's
// host, as its instances register it (registry.LocalHost, read through
// WithEnv).
func NewTransport(e *routing.Engine, opts ...ClientOption) *Transport {
	c := clientConfig(opts)
	t := c.transport
	t.Engine = e
	t.Propagator = c.prop
	if !c.zoneSet {
		t.Zone = strings.TrimSpace(c.getenv(registry.EnvZone))
	} else {
		t.Zone = c.zone
	}
	t.Host = registry.LocalHost(c.getenv)
	if tp := c.tracerProvider(); tp != nil {
		t.Tracer = lanestrace.Tracer(tp)
	}
	return &t
}

// NewClient returns an [http.Client] whose transport is NewTransport(e,
// opts...).
func NewClient(e *routing.Engine, opts ...ClientOption) *http.Client {
	return &http.Client{Transport: NewTransport(e, opts...)}
}

// SingleLabel reports whether host is a bare service name: a name of one DNS
// label, such as "orders", that is a valid service name and not "localhost".
// It is the default of Transport.Services: hosts with a dot (DNS names, IPv4
// addresses) and IPv6 addresses are not lanes services.
func SingleLabel(host string) bool {
	if host == "" || host == "localhost" || strings.IndexByte(host, '.') >= 0 || strings.IndexByte(host, ':') >= 0 {
		return false
	}
	return registry.CheckService(host) == nil
}

// ServiceNames returns a Transport.Services function that matches exactly the
// given names.
func ServiceNames(names ...string) func(host string) bool {
	set := make(map[string]bool, len(names))
	for _, n := range names {
		set[n] = true
	}
	return func(host string) bool { return set[host] }
}

// IsIdempotent is the default of Transport.Idempotent: the methods GET, HEAD,
// OPTIONS, TRACE, PUT and DELETE, and any request with an Idempotency-Key or
// X-Idempotency-Key header, as net/http decides.
func IsIdempotent(req *http.Request) bool {
	return routedcall.IdempotentRequest(req.Method, req.Header)
}

// DefaultClassify is the default of Transport.Classify:
//
//   - an error while the request's context is done (the caller gave up or
//     ran out of time) is Ignore: it says nothing about the instance (but see
//     Transport.ResponseHeaderTimeout);
//   - an error before the request was sent (a refused connection, a failed
//     dial) is Unreachable;
//   - any other error (reset connection, response-header timeout, broken
//     response) is a Failure;
//   - a 5xx response is a Failure, unless it carries the X-Lanes-Error
//     header: that is a routing failure further downstream, answered by a
//     healthy instance;
//   - any other response, including the guard's 421, is a Success.
func DefaultClassify(req *http.Request, res *http.Response, err error) Outcome {
	return routedcall.Classify(attempt(req, res, err))
}

// attempt describes one attempt for the routed-call rules.
func attempt(req *http.Request, res *http.Response, err error) routedcall.Attempt {
	if err != nil {
		return routedcall.Attempt{Err: err, Unsent: Unsent(err), CallerGone: req.Context().Err() != nil}
	}
	var code string
	if v := res.Header[ErrorHeader]; len(v) > 0 { // ErrorHeader is canonical: Get without canonicalising it again
		code = v[0]
	}
	return routedcall.Attempt{
		Status:      res.StatusCode,
		Downstream:  code != "",
		Misdirected: res.StatusCode == http.StatusMisdirectedRequest && code == CodeMisdirected,
	}
}

// Unsent reports whether err, returned by an [http.RoundTripper], came
// before any byte of the request was sent: the dial failed (the connection
// was refused, or timed out).
func Unsent(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// RoundTrip implements [http.RoundTripper]. It does not modify req: it sends
// a copy whose URL host is the instance's address. The Host header stays
// what the caller would have sent: req.Host, or else the URL's host (the
// service name).
func (t *Transport) RoundTrip(req *http.Request) (res *http.Response, rerr error) {
	if req.URL == nil {
		return t.baseFor(false).RoundTrip(req) // the base reports the error
	}
	host := req.URL.Hostname()
	if !t.routes(host) {
		if t.RefuseOthers {
			closeBody(req)
			return nil, fmt.Errorf("%w: host %q", ErrNotService, host)
		}
		return t.baseFor(false).RoundTrip(req)
	}
	if t.Engine == nil {
		closeBody(req)
		return nil, errors.New("laneshttp: Transport.Engine is nil")
	}
	ctx := req.Context()
	svc := t.Engine.Service(host)
	if err := t.waitReady(ctx, svc); err != nil {
		closeBody(req)
		return nil, err
	}
	var c routedcall.Call
	rreq := routing.RequestFromContext(ctx, t.Zone, t.Host)
	var span trace.Span // the request's client span; nil when not traced
	if t.Tracer != nil {
		ctx, span = t.Tracer.Start(ctx, req.Method, trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(semconv.HTTPRequestMethodKey.String(req.Method), semconv.ServerAddress(host)))
		if span.IsRecording() {
			req = req.WithContext(ctx)
		} else {
			span.End()
			span = nil
		}
	}
	if span != nil || t.Metrics != nil {
		defer func() { t.record(span, &c, svc.Name(), rreq.Lane, res, rerr) }()
	}
	pick, err := c.Start(ctx, svc, rreq, t.retries(), routedcall.HeaderTimeout(t.ResponseHeaderTimeout))
	if err != nil {
		closeBody(req)
		return nil, fmt.Errorf("laneshttp: %w", err)
	}
	base := t.baseFor(true)
	body := req.Body
	for {
		res, err := base.RoundTrip(t.outbound(req, pick, body))
		if !c.Again(t.classify(req, res, err), t.retryable(req, res, err), replayable(req)) {
			return res, err
		}
		// A fresh body before the pick, so that a probe claimed by the
		// pick is always sent.
		b, berr := freshBody(req)
		if berr != nil {
			return res, err
		}
		next, ok := c.Next()
		if !ok {
			closeReader(b)
			return res, err
		}
		if res != nil {
			discard(res)
		}
		pick, body = next, b
	}
}

// record counts the call's routing decision in Metrics, and ends its client span (span, when not
// nil) with the decision and the outcome: one description of the decision for both.
func (t *Transport) record(span trace.Span, c *routedcall.Call, service, requested string, res *http.Response, err error) {
	d := lanestrace.DecisionOf(t.Engine, service, requested, c.Pick(), c.PickErr(err), c.Retries())
	t.Metrics.Observe(d.Service, d.Requested, d.Served, d.Reason)
	if span != nil {
		lanestrace.EndHTTP(span, d, res, err)
	}
}

func (t *Transport) retries() int {
	switch {
	case t.Retries == 0:
		return 1
	case t.Retries < 0:
		return 0
	}
	return t.Retries
}

// CloseIdleConnections closes the idle connections of Base, if it has such a
// method; [http.Client.CloseIdleConnections] calls it.
func (t *Transport) CloseIdleConnections() {
	type closeIdler interface{ CloseIdleConnections() }
	for _, routed := range []bool{false, true} {
		if c, ok := t.baseFor(routed).(closeIdler); ok {
			c.CloseIdleConnections()
		}
		if t.Base != nil {
			return
		}
	}
}

// baseFor returns the base of routed requests, or of the others.
func (t *Transport) baseFor(routed bool) http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return defaultBase(baseTimeouts{
		header: routedcall.HeaderTimeout(t.ResponseHeaderTimeout),
		write:  routedcall.Timeout(t.WriteTimeout, DefaultWriteTimeout),
		routed: routed,
	})
}

// baseTimeouts are the timeouts that a default base enforces (0: none), and
// whether it sends routed requests, to instances, whose addresses it checks
// (addrpolicy: link-local and metadata addresses refused).
type baseTimeouts struct {
	header, write time.Duration
	routed        bool
}

// defaultBases holds the default bases, one per pair of timeouts: clones of
// http.DefaultTransport, shared as it is.
var defaultBases sync.Map // baseTimeouts -> *http.Transport

// requestWrites names the parties of a write that timed out.
var requestWrites = &netbound.Names{Peer: "instance", What: "request", Setting: "write timeout"}

func defaultBase(d baseTimeouts) http.RoundTripper {
	if b, ok := defaultBases.Load(d); ok {
		return b.(*http.Transport)
	}
	b := http.DefaultTransport.(*http.Transport).Clone()
	b.ResponseHeaderTimeout = d.header
	if d.routed {
		// As http.DefaultTransport's dialer, with the address rules.
		b.DialContext = (*addrpolicy.Rules)(nil).Dialer(&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	if dial := b.DialContext; d.write > 0 && dial != nil {
		b.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return netbound.NewConn(c, d.write, requestWrites), nil
		}
	}
	actual, _ := defaultBases.LoadOrStore(d, b)
	return actual.(*http.Transport)
}

func (t *Transport) routes(host string) bool {
	if t.Services != nil {
		return t.Services(host)
	}
	return SingleLabel(host)
}

// waitReady waits, the first time a service is called, for the registry to
// list its instances.
func (t *Transport) waitReady(ctx context.Context, svc *routing.Service) error {
	select {
	case <-svc.Ready():
		return nil
	default:
	}
	d := t.ReadyTimeout
	if d < 0 {
		return nil
	}
	if d == 0 {
		d = DefaultReadyTimeout
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-svc.Ready():
	case <-timer.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// outbound returns the request to send to the picked instance: a shallow copy
// of req with its own URL, the given body, and headers that carry the pick's
// request lane. req is not modified.
//
// When the request's context has OpenTelemetry baggage that says otherwise,
// the copy's context has it rewritten to the pick's lane (lane.SyncBaggage),
// so that an otelhttp transport under this one writes the same lane.
func (t *Transport) outbound(req *http.Request, pick routing.Result, body io.ReadCloser) *http.Request {
	var out *http.Request
	var u *url.URL
	if sc := lane.SyncBaggage(req.Context(), pick.RequestLane); sc != req.Context() {
		out = req.WithContext(sc)
		u = new(url.URL)
	} else {
		// The request and its URL in one allocation.
		o := new(outRequest)
		o.req = *req // as http.Request.WithContext copies it
		out, u = &o.req, &o.url
	}
	*u = *req.URL
	u.Host = pick.Instance.Addr
	out.URL = u
	if out.Host == "" {
		out.Host = req.URL.Host
	}
	out.Body = body
	out.Header = t.headers(req.Context(), req.Header, pick.RequestLane)
	if t.Tracer != nil {
		if sc := trace.SpanContextFromContext(req.Context()); sc.IsValid() {
			out.Header = out.Header.Clone() // it may be the caller's, or shared by every request of the lane
			traceContext.Inject(req.Context(), propagation.HeaderCarrier(out.Header))
		}
	}
	return out
}

// outRequest is an outgoing request with its own URL.
type outRequest struct {
	req http.Request
	url url.URL
}

// traceContext writes the W3C traceparent header of a traced request.
var traceContext propagation.TraceContext

// headers returns h with the lane l written, as a copy when that changes
// anything: always for a lane, and for the baseline only when h has lane
// headers to remove or ctx has a request key to carry on.
func (t *Transport) headers(ctx context.Context, h http.Header, l string) http.Header {
	key := l == "" && lane.KeyFromContext(ctx) != ""
	if l == "" && !key && !t.hasLaneHeaders(h) {
		return h
	}
	if len(h) == 0 && l != "" {
		if e := lane.Encode(l); e != nil {
			return e.HTTP // built once per lane; RoundTrippers do not modify headers
		}
	}
	// A copy as http.Header.Clone makes it: one backing array for all the
	// values, each slice capped so that appending to it copies; plus two
	// slots for the lane headers, so that the propagator writes them in
	// place.
	n := 0
	for _, v := range h {
		n += len(v)
	}
	sv := make([]string, n+2)
	c := make(http.Header, len(h)+2)
	for k, v := range h {
		if ck := t.laneKey(k); ck != "" && ck != k {
			// A lane header set under a spelling that is not canonical
			// would go out as a second header: merge it.
			c[ck] = append(c[ck], v...)
			continue
		}
		if v == nil {
			c[k] = nil
			continue
		}
		m := copy(sv, v)
		if prev, ok := c[k]; ok { // merged into from another spelling
			c[k] = append(prev, sv[:m:m]...)
		} else {
			c[k] = sv[:m:m]
		}
		sv = sv[m:]
	}
	if lane.Valid(l) {
		for _, k := range [...]string{"X-Lane", "Baggage"} {
			if len(c[k]) == 0 {
				c[k], sv = sv[:1:1], sv[1:] // an empty baggage value is no member
			}
		}
	} else if key && len(c["Baggage"]) == 0 {
		c["Baggage"] = sv[:1:1]
	}
	t.Propagator.InjectCall(ctx, l, inPlace(c))
	return c
}

// inPlace is a lane.Carrier over headers that the transport owns: Set
// overwrites the first value of a header that has one, instead of allocating
// a new slice.
type inPlace http.Header

func (h inPlace) Get(key string) string      { return lane.HTTPHeader(h).Get(key) }
func (h inPlace) Values(key string) []string { return lane.HTTPHeader(h).Values(key) }
func (h inPlace) Del(key string)             { lane.HTTPHeader(h).Del(key) }

func (h inPlace) Set(key, value string) {
	switch key {
	case lane.Header:
		key = "X-Lane"
	case lane.BaggageHeader:
		key = "Baggage"
	default:
		key = http.CanonicalHeaderKey(key)
	}
	if v := h[key]; len(v) > 0 {
		v[0] = value
		h[key] = v[:1]
		return
	}
	h[key] = []string{value}
}

// laneKey returns the canonical name of k when k is, in any spelling, a
// header that carries the lane (x-lane, baggage, or an alias); "" otherwise.
func (t *Transport) laneKey(k string) string {
	switch {
	case strings.EqualFold(k, lane.Header):
		return "X-Lane"
	case strings.EqualFold(k, lane.BaggageHeader):
		return "Baggage"
	}
	for _, a := range t.Propagator.Aliases {
		if a != "" && strings.EqualFold(k, a) {
			return http.CanonicalHeaderKey(a)
		}
	}
	return ""
}

// hasLaneHeaders reports whether h has a header that a baseline request must
// not carry: x-lane or an alias in any spelling, or a baggage header that
// might have a lane member. It errs on the side of yes.
func (t *Transport) hasLaneHeaders(h http.Header) bool {
	for k, v := range h {
		switch ck := t.laneKey(k); {
		case ck == "":
		case ck == "Baggage":
			for _, s := range v {
				if strings.Contains(s, lane.BaggageKey) {
					return true
				}
			}
		default:
			return true
		}
	}
	return false
}

func (t *Transport) classify(req *http.Request, res *http.Response, err error) Outcome {
	if t.Classify != nil {
		return t.Classify(req, res, err)
	}
	return DefaultClassify(req, res, err)
}

// retryable reports whether an attempt's result calls for another attempt on
// another instance (before the checks on the retry budget, the deadline and
// the body).
func (t *Transport) retryable(req *http.Request, res *http.Response, err error) bool {
	idem := t.idempotent(req)
	if routedcall.Retryable(attempt(req, res, err), idem) {
		return true
	}
	return err == nil && idem && t.RetryStatus != nil && t.RetryStatus(res.StatusCode)
}

func (t *Transport) idempotent(req *http.Request) bool {
	if t.Idempotent != nil {
		return t.Idempotent(req)
	}
	return IsIdempotent(req)
}

// replayable reports whether req's body can be sent again.
func replayable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// freshBody returns a new copy of req's body for another attempt.
func freshBody(req *http.Request) (io.ReadCloser, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return req.Body, nil
	}
	return req.GetBody()
}

func closeBody(req *http.Request) {
	closeReader(req.Body)
}

func closeReader(r io.ReadCloser) {
	if r != nil && r != http.NoBody {
		r.Close()
	}
}

// discard reads a little of a response body that is not returned, so that
// its connection can be reused, and closes it.
func discard(res *http.Response) {
	io.CopyN(io.Discard, res.Body, 4<<10)
	res.Body.Close()
}
