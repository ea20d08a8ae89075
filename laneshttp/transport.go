package laneshttp

import (
	"context"
	"errors"
	"fmt"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/lanesdev/lanes/internal/lib/instdial"
	"github.com/lanesdev/lanes/internal/lib/netbound"
	"github.com/lanesdev/lanes/internal/lib/routedcall"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanestrace"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// DefaultReadyTimeout is how long a Transport waits, at most, for the
// registry to list a service's instances the first time the service is
// called (see WithReadyTimeout).
const DefaultReadyTimeout = 10 * time.Second

// DefaultResponseHeaderTimeout is how long an instance may take to send the
// response headers before the attempt fails (see
// WithResponseHeaderTimeout).
const DefaultResponseHeaderTimeout = routedcall.DefaultResponseHeaderTimeout

// DefaultWriteTimeout is how long an instance may take to take any of a
// write of a request (its head, or a part of its body) before the attempt
// fails (see WithWriteTimeout).
const DefaultWriteTimeout = 10 * time.Second

// ErrNotService is wrapped by the error that a Transport with WithRefuseOthers
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
// Make one with NewTransport (or NewClient), which the client options
// configure: a Transport has no settings of its own to change, and is safe
// for concurrent use. The zero Transport has no engine: it sends the
// requests to other hosts as http.DefaultTransport would, and fails the
// requests to lanes services.
type Transport struct {
	// call is what every routed call of the Transport shares: the engine,
	// the retries, the response-header timeout, the tracer and the
	// metrics.
	call routedcall.Config
	// base is WithBase's; nil means a default base (baseFor).
	base http.RoundTripper
	// zone and host are the caller's, for locality.
	zone, host string
	prop       lane.Propagator
	// services is WithServices' function; nil means SingleLabel.
	services     func(host string) bool
	refuseOthers bool
	// idempotent is WithIdempotent's function; nil means IsIdempotent.
	idempotent  func(*http.Request) bool
	retryStatus func(code int) bool
	// classify is WithClassify's function; nil means DefaultClassify.
	classify func(req *http.Request, res *http.Response, err error) Outcome
	// writeTimeout and readyTimeout are settings: 0 means the default, a
	// negative value none (routedcall.Timeout).
	writeTimeout, readyTimeout time.Duration
}

// NewTransport returns a Transport on the engine e, configured by the client
// options:
//
//   - where requests go: WithServices (which hosts are lanes services),
//     WithRefuseOthers (fail the others), WithBase (the transport that sends
//     them);
//   - the caller: WithZone (default: LANES_ZONE), WithEnv, WithPropagator;
//     the host is this process's, as its instances register it
//     (registry.LocalHost, read through WithEnv);
//   - retries and outcomes: WithRetries, WithIdempotent, WithRetryStatus,
//     WithClassify;
//   - timeouts: WithResponseHeaderTimeout, WithWriteTimeout,
//     WithReadyTimeout, each 0 for its default and negative for none;
//   - observability: WithTracerProvider, WithMetrics.
func NewTransport(e *routing.Engine, opts ...ClientOption) *Transport {
	c := clientConfig(opts)
	t := c.transport
	t.call.Engine = e
	t.prop = c.prop
	if !c.zoneSet {
		t.zone = strings.TrimSpace(c.getenv(registry.EnvZone))
	} else {
		t.zone = c.zone
	}
	t.host = registry.LocalHost(c.getenv)
	if tp := c.tracerProvider(); tp != nil {
		t.call.Tracer = lanestrace.Tracer(tp)
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
// It is the default of WithServices: hosts with a dot (DNS names, IPv4
// addresses) and IPv6 addresses are not lanes services.
func SingleLabel(host string) bool {
	if host == "" || host == "localhost" || strings.IndexByte(host, '.') >= 0 || strings.IndexByte(host, ':') >= 0 {
		return false
	}
	return registry.CheckService(host) == nil
}

// ServiceNames returns a WithServices function that matches exactly the
// given names.
func ServiceNames(names ...string) func(host string) bool {
	set := make(map[string]bool, len(names))
	for _, n := range names {
		set[n] = true
	}
	return func(host string) bool { return set[host] }
}

// IsIdempotent is the default of WithIdempotent: the methods GET, HEAD,
// OPTIONS, TRACE, PUT and DELETE, and any request with an Idempotency-Key or
// X-Idempotency-Key header, as net/http decides.
func IsIdempotent(req *http.Request) bool {
	return routedcall.IdempotentRequest(req.Method, req.Header)
}

// DefaultClassify is the default of WithClassify:
//
//   - an error while the request's context is done (the caller gave up or
//     ran out of time) is Ignore: it says nothing about the instance (but see
//     WithResponseHeaderTimeout);
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
		return routedcall.Attempt{Err: err, Unsent: routedcall.Unsent(err), CallerGone: req.Context().Err() != nil}
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

// RoundTrip implements [http.RoundTripper]. It does not modify req: it sends
// a copy whose URL host is the instance's address. The Host header stays
// what the caller would have sent: req.Host, or else the URL's host (the
// service name).
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil {
		return t.baseFor(false).RoundTrip(req) // the base reports the error
	}
	host := req.URL.Hostname()
	if !t.routes(host) {
		if t.refuseOthers {
			closeBody(req)
			return nil, fmt.Errorf("%w: host %q", ErrNotService, host)
		}
		return t.baseFor(false).RoundTrip(req)
	}
	if t.call.Engine == nil {
		closeBody(req)
		return nil, errors.New("laneshttp: a Transport without an engine: make it with NewTransport")
	}
	ctx := req.Context()
	svc := t.call.Engine.Service(host)
	if err := t.waitReady(ctx, svc); err != nil {
		closeBody(req)
		return nil, err
	}
	carried := lane.Carry(ctx) // the lane and key, read once for the pick and the headers
	rt := roundTrips.Get().(*roundTrip)
	*rt = roundTrip{t: t, req: req, carried: carried, base: t.baseFor(true), body: req.Body}
	defer rt.release()
	sp := routedcall.Spec{Service: svc, Request: routing.RequestOf(carried, t.zone, t.host), Method: req.Method, Idempotent: t.isIdempotent(req)}
	var c routedcall.Call // on the stack: the sender does not hold it
	if err := c.Run(ctx, &t.call, sp, rt); err != nil {
		closeBody(req)
		return nil, fmt.Errorf("laneshttp: %w", err)
	}
	if rt.next {
		closeReader(rt.body) // a copy of the body that no attempt sent
	}
	return rt.res, rt.err
}

// roundTrip sends the attempts of one routed request (a routedcall.Sender).
// roundTrips are pooled: nothing holds one once its request's RoundTrip
// returns, so that the request allocates only the copies it sends
// (outbound).
type roundTrip struct {
	t       *Transport
	req     *http.Request
	carried *lane.Carried // what the request's context carries
	base    http.RoundTripper
	body    io.ReadCloser // the body of the next attempt
	next    bool          // body is a fresh copy, made by Replayable, not sent yet
	res     *http.Response
	err     error
}

var roundTrips = sync.Pool{New: func() any { return new(roundTrip) }}

func (rt *roundTrip) release() {
	*rt = roundTrip{}
	roundTrips.Put(rt)
}

// Send sends an attempt to the instance of pick.
func (rt *roundTrip) Send(ctx context.Context, pick routing.Result) routedcall.Attempt {
	rt.next = false
	req := rt.req
	rt.res, rt.err = rt.base.RoundTrip(rt.t.outbound(ctx, req, rt.carried, pick, rt.body))
	a := attempt(req, rt.res, rt.err)
	if rt.t.classify != nil {
		a.Classified, a.Outcome = true, rt.t.classify(req, rt.res, rt.err)
	}
	a.RetryStatus = rt.err == nil && rt.t.retryStatus != nil && rt.t.retryStatus(rt.res.StatusCode)
	return a
}

// Replayable makes a fresh copy of the request's body for another attempt:
// before the next pick, so that a probe claimed by the pick is always sent.
func (rt *roundTrip) Replayable(routedcall.Outcome) bool {
	if !replayable(rt.req) {
		return false
	}
	b, err := freshBody(rt.req)
	if err != nil {
		return false
	}
	rt.body, rt.next = b, true
	return true
}

// Drop discards the answer of an attempt that another follows.
func (rt *roundTrip) Drop() {
	if rt.res != nil {
		discard(rt.res)
		rt.res = nil
	}
}

// CloseIdleConnections closes the idle connections of Base, if it has such a
// method; [http.Client.CloseIdleConnections] calls it.
func (t *Transport) CloseIdleConnections() {
	type closeIdler interface{ CloseIdleConnections() }
	for _, routed := range []bool{false, true} {
		if c, ok := t.baseFor(routed).(closeIdler); ok {
			c.CloseIdleConnections()
		}
		if t.base != nil {
			return
		}
	}
}

// baseFor returns the base of routed requests, or of the others.
func (t *Transport) baseFor(routed bool) http.RoundTripper {
	if t.base != nil {
		return t.base
	}
	return defaultBase(baseTimeouts{
		header: routedcall.HeaderTimeout(t.call.ResponseHeaderTimeout),
		write:  routedcall.Timeout(t.writeTimeout, DefaultWriteTimeout),
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
		// As http.DefaultTransport's dialer, with the address rules (and
		// through LANES_DIAL's proxy when it is set).
		b.DialContext = instdial.Dialer(&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second})
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
	if t.services != nil {
		return t.services(host)
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
	d := routedcall.Timeout(t.readyTimeout, DefaultReadyTimeout)
	if d == 0 {
		return nil
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
// request lane, made with ctx (the call's context: its client span when it
// is traced), whose lane and key v holds. req is not modified.
//
// When ctx has OpenTelemetry baggage that says otherwise, the copy's
// context has it rewritten to the pick's lane (lane.SyncBaggage), so that an
// otelhttp transport under this one writes the same lane.
func (t *Transport) outbound(ctx context.Context, req *http.Request, v *lane.Carried, pick routing.Result, body io.ReadCloser) *http.Request {
	var out *http.Request
	var u *url.URL
	if sc := lane.SyncBaggage(ctx, pick.RequestLane); sc != req.Context() {
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
	traced := t.call.Tracer != nil && trace.SpanContextFromContext(ctx).IsValid()
	out.Header = t.headers(req.Header, v, pick.RequestLane, traced)
	if traced {
		traceContext.Inject(ctx, inPlace(out.Header)) // into the slot headers made for it
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

// headers returns h with the lane l written, and v's request key for a
// baseline call, as a copy when that changes anything: always for a lane,
// and for the baseline only when h has lane headers to remove or v has a
// request key to carry on. A traced call (traced) always gets a copy, with
// room for the trace context.
func (t *Transport) headers(h http.Header, v *lane.Carried, l string, traced bool) http.Header {
	key := l == "" && v.Key() != ""
	write := l != "" || key || t.hasLaneHeaders(h) // the lane headers change
	if !write && !traced {
		return h
	}
	if len(h) == 0 && l != "" && !traced {
		e := v.Encoded()
		if l != v.Lane() {
			e = lane.Encode(l) // a canary split chose another lane
		}
		if e != nil {
			return e.HTTP // built once per lane; RoundTrippers do not modify headers
		}
	}
	// A copy as http.Header.Clone makes it: one backing array for all the
	// values, each slice capped so that appending to it copies; plus two
	// slots for the lane headers, so that the propagator writes them in
	// place, and a third for the trace context.
	n := 0
	for _, vs := range h {
		n += len(vs)
	}
	sv := make([]string, n+3)
	c := make(http.Header, len(h)+3)
	for k, vs := range h {
		if ck := t.laneKey(k); ck != "" && ck != k {
			// A lane header set under a spelling that is not canonical
			// would go out as a second header: merge it.
			c[ck] = append(c[ck], vs...)
			continue
		}
		if vs == nil {
			c[k] = nil
			continue
		}
		m := copy(sv, vs)
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
		c["Baggage"], sv = sv[:1:1], sv[1:]
	}
	if traced && len(c[traceparent]) == 0 {
		c[traceparent] = sv[:1:1]
	}
	if write {
		t.prop.InjectCarried(v, l, inPlace(c))
	}
	return c
}

// inPlace is a lane.Carrier, and an OpenTelemetry TextMapCarrier, over
// headers that the transport owns: Set overwrites the first value of a
// header that has one, instead of allocating a new slice.
type inPlace http.Header

// traceparent is the canonical key of the W3C trace context header.
const traceparent = "Traceparent"

// Keys returns the header names, for OpenTelemetry's propagators.
func (h inPlace) Keys() []string { return propagation.HeaderCarrier(h).Keys() }

func (h inPlace) Get(key string) string      { return lane.HTTPHeader(h).Get(key) }
func (h inPlace) Values(key string) []string { return lane.HTTPHeader(h).Values(key) }
func (h inPlace) Del(key string)             { lane.HTTPHeader(h).Del(key) }

func (h inPlace) Set(key, value string) {
	switch key {
	case lane.Header:
		key = "X-Lane"
	case lane.BaggageHeader:
		key = "Baggage"
	case "traceparent":
		key = traceparent
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
	for _, a := range t.prop.Aliases {
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

func (t *Transport) isIdempotent(req *http.Request) bool {
	if t.idempotent != nil {
		return t.idempotent(req)
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
