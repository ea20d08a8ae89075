package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lanesdev/lanes/internal/lib/hopspan"
	"github.com/lanesdev/lanes/internal/lib/routedcall"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/lanestrace"
	"github.com/lanesdev/lanes/routing"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Canonical keys of the headers the gateway writes.
const (
	hLane       = "X-Lane"
	hLaneServed = "X-Lane-Served"
	// hLaneFallback says why a lane request was served by another lane
	// than its own (a lanestrace fallback reason).
	hLaneFallback = "X-Lane-Fallback"
	hError        = "X-Lanes-Error"
	hBaggage      = "Baggage"
	hXFF          = "X-Forwarded-For"
	hXFHost       = "X-Forwarded-Host"
	hXFProto      = "X-Forwarded-Proto"
	hRealIP       = "X-Real-Ip"
)

// Error codes of the x-lanes-error header, besides the routing codes.
const (
	codeInvalidLane = "invalid_lane"
	codeNoRoute     = "no_route"
	codeUpstream    = "upstream"
	codeClosed      = "closed"
	codeNotReady    = "not_ready"
	codeBadBody     = "bad_request_body"
	// codeHTTP1Only answers a gRPC call whose instance speaks HTTP/1 only
	// (errHTTP1Only).
	codeHTTP1Only = "upstream_http1"
	// codeOverloaded answers a connection over Config.MaxConns (shed).
	codeOverloaded = "overloaded"
	// The fast stack's answers to requests that its server refuses (see
	// refuse); net/http's server gives its own, without x-lanes-error.
	codeBadRequest   = "bad_request"
	codeHeadTooLarge = "header_too_large"
	codeTimeout      = "request_timeout"
)

// reqState is the core's state of one request, on either stack: the route,
// the lane, the client, the routed call and the request's body. Each stack
// keeps it in its own pooled request state (stdReq, fastReq).
type reqState struct {
	route   *route
	req     routing.Request
	source  src
	grpc    bool
	client  netip.Addr // the client address (see Gateway.clientAddr)
	trusted bool       // the direct peer is a trusted proxy
	hdr     headerView // what the lane propagator reads
	// call is the routed call: the pick, the retries, the reports.
	call routedcall.Call
	// picked is set once the call has an instance.
	picked bool
	// body lends the request body to the attempts (see keptBody); nil
	// when none streams.
	body *keptBody
	// buf is scratch space for header values (see forward).
	buf []byte
}

// pick is the instance of the current attempt.
func (st *reqState) pick() routing.Result { return st.call.Pick() }

// admit is the front of every request, on either stack: it finds the route of the request in
// (its path is path), waits for the engine to be ready for its service, and
// assigns the lane, into st. When the request goes no further it writes the
// answer to out and returns false.
func (g *Gateway) admit(ctx context.Context, st *reqState, in inbound, path string, out responder) bool {
	// The route, on the host without its lane label.
	host := hostOnly(in.hostHeader())
	label, rest, laneHost := g.splitLaneHost(host)
	matchHost := host
	if laneHost {
		matchHost = rest
	}
	rt := g.match(matchHost, path)
	if rt == nil {
		g.m.errors(codeNoRoute)
		g.fail(out, st.grpc, http.StatusNotFound, codeNoRoute, fmt.Sprintf("lanes: no route for host %q and path %q", host, path))
		return false
	}
	if !g.ready(ctx, rt.svc) {
		g.m.errors(codeNotReady)
		g.fail(out, st.grpc, http.StatusServiceUnavailable, codeNotReady, fmt.Sprintf("lanes: service %q: the routing engine is not ready", rt.Service))
		return false
	}
	st.route = rt

	// The lane.
	l, source, bad := g.assign(in, st, label, laneHost)
	if bad != nil {
		g.m.errors(codeInvalidLane)
		g.fail(out, st.grpc, http.StatusBadRequest, codeInvalidLane,
			fmt.Sprintf("lanes: invalid lane %q from %s: breaks the rule %q: %s", bad.value, bad.source, bad.rule, ruleText(bad.rule)))
		return false
	}
	if l != "" {
		l = laneVals(l).Header[0] // a name that outlives the request, shared
	}
	st.req = routing.Request{Lane: l, Zone: g.zone, Host: g.host}
	if l == "" {
		st.req.Key = g.key(in)
	}
	st.source = source
	return true
}

// entrySpan starts the server span of a request that enters lanes here: a new trace, sampled by
// the lane assigned (the context carries it), whose id the answer carries in x-trace-id and W3C
// traceresponse.
func (g *Gateway) entrySpan(ctx context.Context, method, path, l string) (context.Context, trace.Span) {
	return g.tracer.Start(ctx, method, trace.WithSpanKind(trace.SpanKindServer), trace.WithNewRoot(),
		trace.WithAttributes(lanestrace.Entry.Bool(true), lanestrace.Requested.String(l),
			semconv.HTTPRequestMethodKey.String(method), semconv.URLPath(path)))
}

// traceHeaders writes the trace of the entry span to the answer's headers h.
func traceHeaders(h fields, span trace.Span) {
	if sc := span.SpanContext(); sc.IsValid() {
		flags := "00"
		if sc.IsSampled() {
			flags = "01"
		}
		h.Set(HeaderTraceID, sc.TraceID().String())
		h.Set(HeaderTraceResponse, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-"+flags)
	}
}

// The headers of the answer that name its trace.
const (
	HeaderTraceID       = "X-Trace-Id"
	HeaderTraceResponse = "Traceresponse"
)

var baselineServed = []string{"baseline"}[:1:1]

// servedValue is the x-lane-served value of serving lane l.
func (g *Gateway) servedValue(l string) []string {
	if l == "" {
		return baselineServed
	}
	return laneVals(l).Header
}

// ready waits, the first time, for the engine to have read the policy and
// the service's instances.
func (g *Gateway) ready(ctx context.Context, svc *routing.Service) bool {
	pr, sr := g.engine.PolicyReady(), svc.Ready()
	select {
	case <-pr:
		select {
		case <-sr:
			return true
		default:
		}
	default:
	}
	var expired <-chan time.Time // none without a ready timeout
	if g.readyWait > 0 {
		t := time.NewTimer(g.readyWait)
		defer t.Stop()
		expired = t.C
	}
	for _, ch := range []<-chan struct{}{pr, sr} {
		select {
		case <-ch:
		case <-expired:
			return false
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// key returns the request key of canary splits: the key header, the key
// cookie, or the request key member of baggage, normalised as it travels
// (lane.NormalizeKey); a request without one gets a new key. The key lives
// as long as the request (it may be a view of the request's buffer): the
// pick hashes it and the lane headers copy it. The gateway is
// the entry: the key travels on with the baseline request, so that every hop
// splits it as the gateway did.
func (g *Gateway) key(in inbound) string {
	if v := in.Get(g.keyHeader); v != "" {
		return lane.NormalizeKey(v)
	}
	if v, ok := cookie(in.Values("Cookie"), g.keyCookie); ok && v != "" {
		return lane.NormalizeKey(v)
	}
	if k := g.prop.ExtractKey(in); k != "" {
		return k
	}
	return lane.NewKey()
}

// writeLane writes the request lane l to the outbound headers h, removing
// any lane the client sent, and for a baseline request its request key.
func (g *Gateway) writeLane(h fields, l, key string) {
	if l != "" && len(h.Values(hBaggage)) == 0 {
		v := laneVals(l) // the common case, without allocating
		h.setVals(hLane, v.Header)
		h.setVals(hBaggage, v.Baggage)
		return
	}
	g.prop.InjectLaneKey(l, key, h)
}

// interimHeaders removes the instance's lane headers from the fields h of
// an interim answer: the gateway's own go on the final
// answer (laneHeaders).
func interimHeaders(h fields) {
	h.Del(hLane)
	h.Del(hLaneServed)
	h.Del(hLaneFallback)
}

// laneHeaders sets the response headers x-lane and x-lane-served of a
// proxied request on h, removing any that the instance sent. They are set
// once the instance has answered (or failed), as the net/http proxy clears
// the header map after a 1xx response.
func (g *Gateway) laneHeaders(st *reqState, h fields) {
	h.Del(hLaneServed)
	h.Del(hLaneFallback)
	if !st.picked {
		if l := st.req.Lane; l != "" {
			h.setVals(hLane, laneVals(l).Header)
		} else {
			h.Del(hLane)
		}
		return
	}
	res := st.pick()
	if l := res.RequestLane; l != "" {
		h.setVals(hLane, laneVals(l).Header)
	} else {
		h.Del(hLane)
	}
	h.setVals(hLaneServed, g.servedValue(res.Lane))
	if res.RequestLane != "" && res.Lane != res.RequestLane {
		reason := lanestrace.ReasonFailover
		if res.Reason != routing.ReasonFailover {
			reason = hopspan.ReasonFor(g.engine, st.route.Service, res.RequestLane, res.Lane)
		}
		if v, ok := fallbackValues[reason]; ok {
			h.setVals(hLaneFallback, v)
		}
	}
}

// fallbackValues are the X-Lane-Fallback values, by reason, written
// without allocating.
var fallbackValues = func() map[string][]string {
	m := map[string][]string{}
	for _, r := range []string{lanestrace.ReasonNoInstanceInLane, lanestrace.ReasonUnknownLane, lanestrace.ReasonEjected,
		lanestrace.ReasonExpired, lanestrace.ReasonFailover} {
		m[r] = []string{r}[:1:1]
	}
	return m
}()

const grpcUnavailable = "14"

// callFailed answers, on out, a routed call that got no answer (err): the
// engine could not route it (503 and the routing code), the client's body
// broke its framing (400 bad_request_body), the client went away (a bare
// 502), or the instance failed (502 upstream). Both paths call it.
func (g *Gateway) callFailed(out responder, st *reqState, err error, clientGone bool) {
	var re *routing.Error
	if errors.As(err, &re) {
		g.m.errors(string(re.Code))
		g.fail(out, st.grpc, http.StatusServiceUnavailable, string(re.Code), "lanes: "+re.Error())
		return
	}
	if !st.picked {
		g.fail(out, st.grpc, http.StatusInternalServerError, "internal", "lanes: "+err.Error())
		return
	}
	if berr := st.body.Failed(); berr != nil {
		// The client's body broke its framing (a bad chunk, say): the
		// client's fault, and its connection cannot be read further.
		g.m.errors(codeBadBody)
		out.header().setVals("Connection", connClose)
		g.fail(out, st.grpc, http.StatusBadRequest, codeBadBody, "lanes: reading the request body: "+berr.Error())
		return
	}
	if clientGone {
		out.writeHeader(http.StatusBadGateway)
		return
	}
	inst := st.pick().Instance
	if errors.Is(err, errHTTP1Only) {
		g.m.errors(codeHTTP1Only)
		g.log.Warn("lanes gateway: a gRPC call reached an instance that speaks HTTP/1 only", "service", st.route.Service,
			"instance", inst.ID, "addr", inst.Addr, "lane", st.pick().RequestLane)
		msg := fmt.Sprintf("lanes: service %q, instance %q speaks HTTP/1 only: a gRPC call needs HTTP/2 (h2c); route gRPC to a gRPC instance", st.route.Service, inst.ID)
		g.fail(out, st.grpc, http.StatusBadGateway, codeHTTP1Only, msg)
		return
	}
	g.m.errors(codeUpstream)
	g.log.Warn("lanes gateway: upstream call failed", "service", st.route.Service, "instance", inst.ID, "addr", inst.Addr,
		"lane", st.pick().RequestLane, "retried", st.call.Retried(), "err", err)
	msg := fmt.Sprintf("lanes: service %q, instance %q: %v", st.route.Service, inst.ID, err)
	g.fail(out, st.grpc, http.StatusBadGateway, codeUpstream, msg)
}

var connClose = []string{"close"}[:1:1]

// routed is the routed call of a request, on either stack: the pick, the
// outcome of each attempt, reported, the decision to try another instance,
// and the client span (routedcall.Call.Run holds the rules); s, the stack's
// sender, makes the attempts. It returns the error of a call that the engine
// could not route; the last attempt's answer or error is the sender's.
func (g *Gateway) routed(ctx context.Context, st *reqState, method string, idem bool, s routedcall.Sender) error {
	return st.call.Run(ctx, &g.call, routedcall.Spec{Service: st.route.svc, Request: st.req, Method: method, Idempotent: idem}, s)
}

// attempting is what a sender does before each attempt of a call: before the
// first, the call has an instance and its source is counted; before another,
// the move is logged (err: the previous attempt's).
func (g *Gateway) attempting(st *reqState, pick routing.Result, first bool, err error) {
	if !first {
		g.log.Debug("lanes gateway: trying another instance", "service", st.route.Service,
			"next", pick.Instance.ID, "err", err)
		return
	}
	st.picked = true
	source := st.source
	if st.req.Lane == "" && pick.RequestLane != "" {
		source = srcCanary
	}
	g.m.source(source)
}

// stallNote is what the gateway tells of an answer whose body the instance
// stopped sending for the upstream read timeout, after its head went to the
// client: a log line that names the timeout, and
// the instance's failure (routedcall.BodyStalled). The client's connection
// is cut by the path's server (the body's read fails).
type stallNote struct {
	g       *Gateway
	service string
	pick    routing.Result
}

func (n *stallNote) report(err error) {
	inst := n.pick.Instance
	n.g.log.Warn("lanes gateway: upstream answer cut", "service", n.service, "instance", inst.ID, "addr", inst.Addr,
		"lane", n.pick.RequestLane, "err", err)
	routedcall.BodyStalled(n.pick)
}

// replayable is the rule for sending a request again after
// an attempt that ended o: one without a body can always be sent again (the
// retry rules decide whether it is); one with a body only after Unreachable
// (nothing was sent), and only while no attempt has read any of its body
// from the client (b). A body that streams from the client is read once: a
// request part of whose body went to one instance is never sent to another
// with the rest. A body held whole in memory (the fast stack's small ones)
// is never read from the client by an attempt, and can be sent again.
func replayable(o routedcall.Outcome, bodyless bool, b *keptBody) bool {
	return bodyless || o == routedcall.Unreachable && (b == nil || !b.read)
}

// traceContext writes the W3C traceparent header of a traced upstream call.
var traceContext propagation.TraceContext

// attempt describes an attempt for the routed-call rules: its answer's
// status and X-Lanes-Error code, or its error (unsent: before any byte of
// the request left).
func attempt(st *reqState, status int, code string, err error, unsent bool) routedcall.Attempt {
	if err != nil {
		// A request body that failed to read is the client's failure, not
		// the instance's: it counts as the caller gone.
		return routedcall.Attempt{Err: err, Unsent: unsent, CallerGone: st.call.CallerGone() || st.body.Failed() != nil}
	}
	return routedcall.Attempt{
		Status:      status,
		Downstream:  code != "",
		Misdirected: status == http.StatusMisdirectedRequest && code == laneshttp.CodeMisdirected,
	}
}

// keptBody lends the client's request body, as it streams, to the
// attempts: it does not close it (the server does, when the handler
// returns), and tells whether any of it was read, so that a request whose
// connection was refused can move on to another instance with its body
// intact (see replayable), whether it was read to its end, and whether
// reading it failed (a malformed chunked body, a client gone mid-body).
type keptBody struct {
	r    io.Reader
	read bool
	// eof is set once r was read to its end; atomic, as a transport may
	// read the body on a goroutine of its own while the stack asks.
	eof atomic.Bool
	err error // the first error reading r, other than io.EOF
	// size is the body's length as the client framed it, when r does not
	// check it itself, or -1; got counts what was read of it.
	size int
	got  int
	// conn, when set, is the client's connection: each read is bounded
	// by d, the client read timeout (Config.ClientReadTimeout), and the
	// deadline lifted at the end of the body.
	conn interface{ SetReadDeadline(time.Time) error }
	d    time.Duration
	// mu orders the deadlines that Read and Cut set; cut is set once the
	// body was cut (Cut).
	mu  sync.Mutex
	cut bool
}

func (b *keptBody) Read(p []byte) (int, error) {
	b.read = true
	if b.conn != nil {
		b.deadline()
	}
	n, err := b.r.Read(p)
	b.got += n
	if err == io.EOF && b.got < b.size {
		err = io.ErrUnexpectedEOF // the client closed before the end
	}
	switch {
	case err == io.EOF:
		if b.conn != nil && b.d > 0 {
			// The wait for the answer is not the body's: net/http's
			// server reads the connection in the background meanwhile.
			b.conn.SetReadDeadline(time.Time{})
		}
		b.eof.Store(true)
	case err != nil:
		b.mu.Lock()
		if b.err == nil {
			b.err = err
		}
		b.mu.Unlock()
	}
	return n, err
}

func (b *keptBody) Close() error { return nil }

// deadline sets the read deadline of the client's connection before a
// read: d from now, or now once the body is cut.
func (b *keptBody) deadline() {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.cut:
		b.conn.SetReadDeadline(time.Now())
	case b.d > 0:
		b.conn.SetReadDeadline(time.Now().Add(b.d))
	}
}

// Cut ends the body's reads from the client: the one in flight and every
// later one fail at once. The upstream client cuts the body of an upload
// that the instance answered before its end; a read that the cut ended is
// no failure of the client's (Failed).
func (b *keptBody) Cut() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cut = true
	if b.conn != nil {
		b.conn.SetReadDeadline(time.Now())
	}
}

// Size is the body's length as the client framed it, or -1.
func (b *keptBody) Size() int { return b.size }

// Started reports whether any of the body was read.
func (b *keptBody) Started() bool { return b.read }

// Failed is the error reading the body broke on, if any (not one that a
// cut caused); b may be nil.
func (b *keptBody) Failed() error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cut {
		return nil
	}
	return b.err
}

// fail writes an error of the gateway on out: text with x-lanes-error, or
// for a gRPC call a trailers-only gRPC status.
func (g *Gateway) fail(out responder, grpc bool, status int, code, msg string) {
	h := out.header()
	h.Set(hError, code)
	if grpc {
		h.setVals("Content-Type", ctGRPC)
		h.Set("Grpc-Status", grpcCode(status))
		h.Set("Grpc-Message", grpcEscape(msg))
		out.writeHeader(http.StatusOK)
		return
	}
	h.setVals("Content-Type", ctText)
	h.setVals("X-Content-Type-Options", nosniff)
	out.writeHeader(status)
	out.writeString(msg + "\n")
}

var (
	ctGRPC  = []string{"application/grpc"}[:1:1]
	ctText  = []string{"text/plain; charset=utf-8"}[:1:1]
	nosniff = []string{"nosniff"}[:1:1]
)

// grpcCode maps the gateway's HTTP statuses to gRPC codes.
func grpcCode(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "3" // InvalidArgument
	case http.StatusNotFound:
		return "12" // Unimplemented
	case http.StatusInternalServerError:
		return "13" // Internal
	}
	return grpcUnavailable
}

// grpcEscape percent-encodes a grpc-message value.
func grpcEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= ' ' && c <= '~' && c != '%' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}
