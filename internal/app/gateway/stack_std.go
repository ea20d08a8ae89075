package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lanesdev/lanes/internal/app/gateway/upstream"
	"github.com/lanesdev/lanes/internal/lib/addrpolicy"
	"github.com/lanesdev/lanes/internal/lib/netbound"
	"github.com/lanesdev/lanes/internal/lib/routedcall"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/routing"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/http/httpguts"
)

// The net/http stack: net/http's server parses the client's requests,
// httputil.ReverseProxy copies the answers, and its Transport
// (stdTransport) routes each request with the routed call and sends the
// attempts over net/http's transports, HTTP/1.1 with keep-alive or h2c for
// gRPC. It serves HTTP/2 (h2c, gRPC, and TLS) on every gateway, HTTP/1.1
// with Config.HTTP1 std, and the requests that the fast stack hands over.

// stdStack is the net/http stack of a gateway.
type stdStack struct {
	g     *Gateway
	proxy *httputil.ReverseProxy
	h1    http.RoundTripper // HTTP/1.1 with keep-alive
	h2c   http.RoundTripper // h2c, for gRPC
	pool  sync.Pool         // *stdReq
	// servers are the net/http servers that serve, serveTLS and the fast
	// stack's HTTP/2 connections run.
	servers serverSet[*http.Server]
}

func newStdStack(g *Gateway, dial *addrpolicy.Rules) *stdStack {
	s := &stdStack{g: g}
	s.h1, s.h2c = newTransports(g.idle, g.upIdle, g.headerTimeout, g.writeTimeout, dial)
	s.proxy = &httputil.ReverseProxy{
		Rewrite:        s.rewrite,
		Transport:      &stdTransport{s: s},
		ModifyResponse: s.modifyResponse,
		ErrorHandler:   s.proxyError,
		ErrorLog:       slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
		BufferPool:     bufferPool{},
	}
	s.pool.New = func() any { return new(stdReq) }
	return s
}

// stdReq is the state of a request on the net/http stack: the core's, and
// what the proxy's hooks need. It is pooled, and reaches the hooks through
// the request's context.
type stdReq struct {
	reqState
	w http.ResponseWriter
	// conn is the client's connection, on an HTTP/1.x request to a server
	// that Serve started; else nil.
	conn net.Conn
	send stdSend
	// out is the proxy's ResponseWriter.
	out answerWriter
}

type stateKey struct{}

func stateOf(ctx context.Context) *stdReq {
	st, _ := ctx.Value(stateKey{}).(*stdReq)
	return st
}

func (s *stdStack) putReq(st *stdReq) {
	buf := st.buf[:0]
	*st = stdReq{}
	st.buf = buf
	s.pool.Put(st)
}

// ServeHTTP is the net/http stack's handler (Gateway.ServeHTTP).
func (s *stdStack) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g := s.g
	if r.ProtoMajor == 1 && r.ProtoMinor == 0 {
		defer resetOnAbort(r)
	}
	grpc := isGRPC(r)
	if !g.enter() {
		g.closingAnswer(stdOut{w}, grpc)
		return
	}
	defer g.exit()
	st := s.pool.Get().(*stdReq)
	defer s.putReq(st)
	st.w, st.grpc = w, grpc
	// Every answer goes through st.out, which applies the framing rules.
	st.out = answerWriter{ResponseWriter: w, g: g, f: framingOf(r.ProtoMajor, r.ProtoMinor, len(r.TransferEncoding) > 0)}
	if r.ProtoMajor == 1 {
		// The client's connection, whose reads of the body the client
		// read timeout bounds (keptBody); none on a server of your own.
		st.conn, _ = r.Context().Value(clientConnKey{}).(net.Conn)
	}
	if !g.admit(r.Context(), &st.reqState, (*stdIn)(r), r.URL.Path, stdOut{&st.out}) {
		return
	}
	ctx := context.WithValue(r.Context(), stateKey{}, st)
	if g.tracer != nil {
		var span trace.Span
		ctx, span = g.entrySpan(lane.WithLane(ctx, st.req.Lane), r.Method, r.URL.Path, st.req.Lane)
		traceHeaders(stdFields(w.Header()), span)
		defer span.End()
	}
	// The proxy's Transport (stdTransport) routes the request.
	s.proxy.ServeHTTP(&st.out, r.WithContext(ctx))
}

// answerWriter is the ResponseWriter of the net/http stack's answers, the
// gateway's own and the proxy's. It applies the framing rules (framing.go)
// to an answer's head, through the 1xx answers that the proxy passes on
// (after each of which the proxy clears the header map). It unwraps
// (http.ResponseController).
type answerWriter struct {
	http.ResponseWriter
	g *Gateway
	f framing
}

func (w *answerWriter) WriteHeader(code int) {
	if interimStatus(code) {
		if !w.f.passInterim() {
			return // the proxy clears the 1xx answer's fields after it
		}
		interimHeaders(stdFields(w.Header()))
	} else if w.g.closeAfter(w.f) {
		w.Header()["Connection"] = connClose
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *answerWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// clientConnKey is the context key of the client's connection, on the
// servers that Serve starts.
type clientConnKey struct{}

// resetOnAbort resets the client's connection (reset) when the answer to
// the HTTP/1.0 request r was cut short: ReverseProxy aborts the handler
// with http.ErrAbortHandler once it cannot copy the rest of the answer, and
// net/http's server would then end the connection as it ends a whole
// answer, which an answer read to the end of the connection cannot be told
// from. It goes on with the panic, for the server. On a server of your own
// (no connection in r's context) the connection ends as that server ends
// it.
func resetOnAbort(r *http.Request) {
	v := recover()
	if v == nil {
		return
	}
	if v == http.ErrAbortHandler {
		if c, ok := r.Context().Value(clientConnKey{}).(net.Conn); ok {
			reset(c)
		}
	}
	panic(v)
}

// rewrite builds the outbound request: the instance's URL, the path without
// a stripped prefix, the forwarding headers and the lane headers.
func (s *stdStack) rewrite(pr *httputil.ProxyRequest) {
	g := s.g
	st := stateOf(pr.In.Context())
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = st.route.Service // the transport routes it to an instance
	if st.route.StripPrefix {
		stripURL(out.URL, st.route.prefix)
	}
	if g.preserve {
		out.Host = pr.In.Host
	} else {
		out.Host = ""
	}
	// Expect: 100-continue is the gateway's server's to answer (it does,
	// on the handler's first read of the body), as fasthttp's does: sent
	// on, the instance's 100 would reach the client as a second one.
	delete(out.Header, "Expect")
	// The trailers of a chunked body: the server fills the client's map in
	// once the body is read, which the transport then writes after the
	// body; a copy (as ProxyRequest's Out has) would stay empty.
	out.Trailer = pr.In.Trailer

	// Lane headers: nothing the client sent; the transport writes what the
	// gateway decided, once the pick tells the request lane.
	s.stripLaneHeaders(out.Header)
	g.forward(stdFields(out.Header), (*stdIn)(pr.In), &st.reqState, pr.In.TLS != nil)
}

// modifyResponse settles the lane headers of the response; for a gRPC call
// whose status comes in the trailers, it reports the outcome once they are
// in.
func (s *stdStack) modifyResponse(resp *http.Response) error {
	g := s.g
	st := stateOf(resp.Request.Context())
	h := resp.Header
	delete(h, hLane) // the gateway's own go on the ResponseWriter
	delete(h, hLaneServed)
	g.laneHeaders(&st.reqState, stdFields(st.w.Header()))
	g.m.served(st.pick().Lane)
	if st.body != nil && !st.body.eof.Load() && resp.Request.ProtoMajor == 1 {
		// The instance answered before the transport read the client's
		// body through (a 401 or 413 to an upload): the connection closes
		// after the answer (as the fast stack's handle does), and net/http's server
		// then sends the answer at once, where it would first take the
		// body's lock to drain the rest, which the transport, blocked
		// reading it from a client that waits for the answer, holds.
		st.w.Header()["Connection"] = connClose
	}
	if st.grpc && resp.StatusCode < 500 && len(h["Grpc-Status"]) == 0 {
		resp.Body = &grpcBody{ReadCloser: resp.Body, resp: resp, st: &st.reqState}
	}
	return nil
}

// grpcBody reports a gRPC call once its trailers are in.
type grpcBody struct {
	io.ReadCloser
	resp *http.Response
	st   *reqState
}

func (b *grpcBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF:
		b.st.call.Report(grpcOutcome(b.resp.Trailer))
	case err != nil && !b.st.call.CallerGone():
		b.st.call.Report(routedcall.Failure)
	}
	return n, err
}

func (b *grpcBody) Close() error {
	if !b.st.call.CallerGone() {
		b.st.call.Report(grpcOutcome(b.resp.Trailer))
	} else {
		b.st.call.Report(routedcall.Ignore) // a failure if the instance was that late
	}
	return b.ReadCloser.Close()
}

// grpcOutcome classifies a gRPC call by the grpc-status in h; no status is
// no verdict.
func grpcOutcome(h http.Header) routedcall.Outcome {
	v := h["Grpc-Status"]
	if len(v) == 0 {
		return routedcall.Ignore
	}
	code, err := strconv.ParseUint(v[0], 10, 32)
	if err != nil {
		return routedcall.Failure
	}
	return routedcall.ClassifyGRPC(uint32(code))
}

// proxyError answers a call that got no response from the instance, or
// that the engine could not route.
func (s *stdStack) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	g := s.g
	st := stateOf(r.Context())
	g.laneHeaders(&st.reqState, stdFields(w.Header()))
	g.callFailed(stdOut{w}, &st.reqState, err, r.Context().Err() != nil)
}

// upstream is the proxy's Transport: it routes each request with the
// routed-call step (Gateway.routed), and sends the attempts: gRPC over h2c,
// the rest over HTTP/1.1 with keep-alive. An idempotent request without a
// body is retried once on another instance after a failure without an
// answer; any request moves past an instance that refused its connection,
// since nothing was sent.
type stdTransport struct{ s *stdStack }

// stdSend sends the attempts of a net/http request.
type stdSend struct {
	g        *Gateway
	st       *reqState
	rt       http.RoundTripper
	req      *http.Request // the proxy's outbound request
	out      *http.Request // the current attempt's
	bodyless bool
	res      *http.Response
	err      error
	// conn, for a gRPC call, tells the h2c connection of the attempt.
	conn *connTrace
}

// connTrace tells the h2c connection of an attempt (a gRPC call's), so that
// an error on a connection to an instance that speaks HTTP/1 only is told as
// such whatever error the transport returns (it returns a generic one when
// the connection failed before the attempt's stream was on it). One for
// each attempt, never reused: the transport may read its trace after the
// attempt.
type connTrace struct {
	trace httptrace.ClientTrace
	conn  atomic.Pointer[h2cConn]
}

func newConnTrace() *connTrace {
	t := new(connTrace)
	t.trace.GotConn = func(info httptrace.GotConnInfo) {
		c, _ := info.Conn.(*h2cConn)
		t.conn.Store(c)
	}
	return t
}

// http1Only reports whether the attempt's error, s.err, is that of an
// instance that speaks HTTP/1 only (errHTTP1Only).
func (s *stdSend) http1Only() bool {
	if errors.Is(s.err, errHTTP1Only) {
		return true
	}
	if s.conn == nil {
		return false
	}
	c := s.conn.conn.Load()
	return c != nil && c.http1.Load()
}

func (t *stdTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	st := stateOf(req.Context())
	if st == nil {
		closeBody(req)
		return nil, errors.New("lanes gateway: a request that did not come through the gateway's handler")
	}
	g := t.s.g
	rt := t.s.h1
	if st.grpc {
		rt = t.s.h2c
	}
	// The first attempt sends req itself, which the proxy made for it.
	bodyless := req.Body == nil || req.Body == http.NoBody
	if !bodyless {
		st.body = &keptBody{r: req.Body, size: -1}
		if st.conn != nil && g.clientRead > 0 {
			st.body.conn, st.body.d = st.conn, g.clientRead
		}
		req.Body = st.body
	}
	s := &st.send
	*s = stdSend{g: g, st: &st.reqState, rt: rt, req: req, bodyless: bodyless}
	if err := g.routed(req.Context(), &st.reqState, req.Method, idempotent(req.Method, req.Header), s); err != nil {
		closeBody(req)
		return nil, err
	}
	// An upgrade's body is the connection, which the proxy copies both
	// ways: not an answer's body, and not bounded.
	if s.res != nil && !st.grpc && g.readTimeout > 0 && s.res.Body != http.NoBody && s.res.StatusCode != http.StatusSwitchingProtocols {
		s.res.Body = newStallBody(s.res.Body, g.readTimeout, stallNote{g: g, service: st.route.Service, pick: st.pick()})
	}
	return s.res, s.err
}

// stallBody is the body of an answer on the net/http path, each read of
// which is bounded by the upstream read timeout d, as the fast path bounds
// each read of its connections (upConn.Read): its timer checks, every d at
// most, whether a read has been waiting for d, and then closes the
// transport's body, which closes the connection (the transport reads it on
// goroutines of its own, out of the gateway's reach) and fails the read,
// with a *upstream.ReadTimeoutError. The time the gateway spends writing to the
// client between two reads does not count. stallBodies are pooled with
// their timers.
type stallBody struct {
	rc    io.ReadCloser
	d     time.Duration
	note  stallNote
	mu    sync.Mutex // orders watch and Close
	t     *time.Timer
	done  bool         // closed, under mu
	since atomic.Int64 // when the read in flight began, Unix ns; 0: none
	fired atomic.Bool
}

var stallBodies sync.Pool // *stallBody, with a stopped timer

func newStallBody(rc io.ReadCloser, d time.Duration, note stallNote) *stallBody {
	b, _ := stallBodies.Get().(*stallBody)
	if b == nil {
		b = new(stallBody)
		b.mu.Lock()
		b.t = time.AfterFunc(d, b.watch)
	} else {
		b.mu.Lock()
		b.t.Reset(d)
	}
	b.rc, b.d, b.note, b.done = rc, d, note, false
	b.mu.Unlock()
	return b
}

func (b *stallBody) watch() {
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return
	}
	next := b.d
	if s := b.since.Load(); s != 0 {
		waited := time.Duration(time.Now().UnixNano() - s)
		if waited >= b.d {
			b.fired.Store(true)
			rc := b.rc // b is not pooled again: its timer fired
			b.mu.Unlock()
			// The read in flight fails once the connection closes; the
			// transport's Close returns once it has.
			rc.Close()
			return
		}
		next = b.d - waited
	}
	b.t.Reset(next)
	b.mu.Unlock()
}

func (b *stallBody) Read(p []byte) (int, error) {
	b.since.Store(time.Now().UnixNano())
	n, err := b.rc.Read(p)
	b.since.Store(0)
	if err != nil && err != io.EOF && b.fired.Swap(false) {
		rt := &upstream.ReadTimeoutError{D: b.d, Err: err}
		b.note.report(rt)
		return n, rt
	}
	return n, err
}

// Close closes the transport's body and puts b back in the pool, unless
// its timer has fired: then the timer's goroutine may still hold it.
func (b *stallBody) Close() error {
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return nil
	}
	b.done = true
	stopped := b.t.Stop()
	rc := b.rc
	b.mu.Unlock()
	err := rc.Close()
	if stopped && !b.fired.Load() {
		b.rc, b.note = nil, stallNote{}
		stallBodies.Put(b)
	}
	return err
}

func (s *stdSend) Send(ctx context.Context, pick routing.Result) routedcall.Attempt {
	traced := ctx != s.req.Context() // the client span's
	s.g.attempting(s.st, pick, s.out == nil, s.err)
	rctx := ctx
	if s.st.grpc {
		s.conn = newConnTrace()
		rctx = httptrace.WithClientTrace(ctx, &s.conn.trace)
	}
	if s.out == nil {
		s.out = s.req
		if rctx != s.req.Context() {
			s.out = s.req.WithContext(rctx)
		}
	} else {
		// A new request for the next attempt: the transport may still hold
		// the previous one.
		r2 := s.req.WithContext(rctx)
		u2 := *s.req.URL
		r2.URL = &u2
		r2.Header = s.req.Header.Clone()
		s.out = r2
	}
	out := s.out
	out.URL.Host = pick.Instance.Addr
	s.g.writeLane(stdFields(out.Header), pick.RequestLane, s.st.req.Key)
	if traced {
		traceContext.Inject(ctx, propagation.HeaderCarrier(out.Header))
	}
	s.res, s.err = s.rt.RoundTrip(out)
	if s.err == nil && s.res.StatusCode == http.StatusSwitchingProtocols {
		if asked, got := upgradeOf(out.Header), upgradeOf(s.res.Header); got == "" || !strings.EqualFold(asked, got) {
			s.res.Body.Close() // the connection, which ReverseProxy would leave open
			s.res, s.err = nil, &upstream.SwitchError{Asked: asked, Got: got}
		}
	}
	if s.err == nil && s.st.grpc && s.res.StatusCode < 500 {
		if v := s.res.Header["Grpc-Status"]; len(v) > 0 { // trailers-only
			s.st.call.Report(grpcOutcome(s.res.Header))
		}
		// Otherwise the status comes in the trailers (modifyResponse).
		return routedcall.Attempt{Status: s.res.StatusCode, Final: true}
	}
	if s.err != nil {
		if s.st.grpc && s.http1Only() {
			// The instance cannot serve gRPC, which says nothing about
			// its health: its HTTP/1.1 traffic goes on.
			s.err = errHTTP1Only
			return routedcall.Attempt{Err: s.err, Classified: true, Outcome: routedcall.Ignore}
		}
		if strings.Contains(s.err.Error(), "server response headers exceeded") {
			// net/http's transport found the head over
			// MaxResponseHeaderBytes: an error without a type of its
			// own, told by its text, said in the fast stack's words.
			s.err = upstream.ErrResponseHeadTooLarge
		}
		return attempt(s.st, 0, "", s.err, routedcall.Unsent(s.err))
	}
	return attempt(s.st, s.res.StatusCode, s.res.Header.Get(hError), nil, false)
}

// upgradeOf is the protocol that the Upgrade header of h names, when its
// Connection header has the upgrade option, as httputil.ReverseProxy reads
// it (with the same httpguts test); "" for none.
func upgradeOf(h http.Header) string {
	if !httpguts.HeaderValuesContainsToken(h["Connection"], "Upgrade") {
		return ""
	}
	return h.Get("Upgrade")
}

func (s *stdSend) Replayable(o routedcall.Outcome) bool {
	return replayable(o, s.bodyless, s.st.body)
}

func (s *stdSend) Drop() {
	if s.res != nil {
		discard(s.res)
		s.res = nil
	}
}

func closeBody(req *http.Request) {
	if req.Body != nil && req.Body != http.NoBody {
		req.Body.Close()
	}
}

// discard reads a little of a response body that is not returned, so that
// its connection can be reused, and closes it.
func discard(res *http.Response) {
	io.CopyN(io.Discard, res.Body, 4<<10)
	res.Body.Close()
}

// isGRPC reports whether r is a gRPC call (not gRPC-Web).
func isGRPC(r *http.Request) bool {
	ct := r.Header["Content-Type"]
	if len(ct) == 0 || r.ProtoMajor != 2 {
		return false
	}
	c := ct[0]
	return strings.HasPrefix(c, "application/grpc") &&
		(len(c) == len("application/grpc") || c[len("application/grpc")] == '+' || c[len("application/grpc")] == ';')
}

// newTransports returns the net/http path's transports, which keep an idle
// connection for idleTimeout: h1 bounds the wait
// for the response headers by headerTimeout and each write of a request by
// writeTimeout (netbound.Conn); h2c closes a connection that answers no ping
// within headerTimeout or takes no byte for writeTimeout. Both dial only what
// rules allow.
func newTransports(idle int, idleTimeout, headerTimeout, writeTimeout time.Duration, rules *addrpolicy.Rules) (h1, h2c *http.Transport) {
	dialer := rules.Dialer(&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second})
	dialBounded := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil || writeTimeout <= 0 {
			return c, err
		}
		return netbound.NewConn(c, writeTimeout, upstream.InstanceWrites), nil
	}
	var p1, p2 http.Protocols
	p1.SetHTTP1(true)
	p2.SetUnencryptedHTTP2(true)
	h1 = &http.Transport{
		Proxy:                 nil, // never an environment proxy
		DialContext:           dialBounded,
		MaxIdleConnsPerHost:   idle,
		IdleConnTimeout:       idleTimeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true, // pass encodings through untouched
		Protocols:             &p1,
		ResponseHeaderTimeout: headerTimeout,
		// As the fast stack bounds a head.
		MaxResponseHeaderBytes: upstream.MaxResponseHead,
	}
	h2c = &http.Transport{
		Proxy:              nil,
		DialContext:        dialH2C(dialer.DialContext),
		IdleConnTimeout:    idleTimeout,
		DisableCompression: true,
		Protocols:          &p2,
	}
	if headerTimeout > 0 || writeTimeout > 0 {
		// A paused instance answers no ping, and takes no byte: its
		// connection is closed.
		h2c.HTTP2 = &http.HTTP2Config{SendPingTimeout: headerTimeout, PingTimeout: headerTimeout, WriteByteTimeout: writeTimeout}
	}
	return h1, h2c
}

// bufferPool lends ReverseProxy its copy buffers.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *buffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { buffers.Put(&b) }

// CopyBuffers is the pool of the gateway's ReverseProxy copy buffers, for
// every httputil.ReverseProxy of lanes (the sidecar's): without one, each
// request allocates its own 32 KiB buffer.
var CopyBuffers httputil.BufferPool = bufferPool{}

// serve serves ln on net/http, HTTP/1.1 and h2c, each write to a client
// bounded by the client write timeout (Gateway.Serve).
func (s *stdStack) serve(ln net.Listener) error {
	if d := s.g.clientWrite; d > 0 {
		ln = clientListener{Listener: ln, d: d}
	}
	return s.serveH2C(ln)
}

// serveH2C serves ln on net/http, HTTP/1.1 and h2c (the fast stack hands
// its HTTP/2 connections, already bounded, to it).
func (s *stdStack) serveH2C(ln net.Listener) error {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return s.run(ln, &p, nil)
}

// serveTLS serves ln over TLS with the certificates of tc, HTTP/2 and
// HTTP/1.1 by ALPN (Gateway.ServeTLS).
func (s *stdStack) serveTLS(ln net.Listener, tc *tls.Config) error {
	if d := s.g.clientWrite; d > 0 {
		ln = clientListener{Listener: ln, d: d}
	}
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetHTTP2(true)
	return s.run(ln, &p, tc)
}

// run serves ln on net/http with the protocols p, over TLS with tc when
// it is not nil.
func (s *stdStack) run(ln net.Listener, p *http.Protocols, tc *tls.Config) error {
	g := s.g
	srv := &http.Server{
		Handler:           s,
		Protocols:         p,
		TLSConfig:         tc,
		ReadHeaderTimeout: g.clientHeader,
		IdleTimeout:       g.clientIdle,
		MaxHeaderBytes:    stdMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
		// The client's connection, which resetOnAbort resets.
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, clientConnKey{}, c)
		},
	}
	if !s.servers.add(&g.closing, ln, srv) {
		return http.ErrServerClosed
	}
	defer s.servers.remove(srv)
	if tc != nil {
		return srv.ServeTLS(ln, "", "")
	}
	return srv.Serve(ln)
}

// shutdown shuts the servers down gracefully (http.Server.Shutdown).
func (s *stdStack) shutdown(ctx context.Context) error {
	var errs []error
	for _, srv := range s.servers.all() {
		if err := srv.Shutdown(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// close closes the servers and their connections, which cancels the
// requests in flight and their attempts.
func (s *stdStack) close() error {
	var errs []error
	for _, srv := range s.servers.all() {
		if err := srv.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// release closes the transports' idle connections.
func (s *stdStack) release(context.Context) {
	for _, rt := range []http.RoundTripper{s.h1, s.h2c} {
		if c, ok := rt.(interface{ CloseIdleConnections() }); ok {
			c.CloseIdleConnections()
		}
	}
}

// stdHeaderSlack is what net/http's server adds to MaxHeaderBytes.
const stdHeaderSlack = 4 << 10

// stdMaxHeaderBytes is net/http's Server.MaxHeaderBytes: HTTP/2's header
// list limit, which net/http derives from it, is then about 12 KiB.
const stdMaxHeaderBytes = maxHeaderBytes - stdHeaderSlack

// clientListener hands the net/http path's server its connections as
// netbound.Conns: each write within the client write timeout.
type clientListener struct {
	net.Listener
	d time.Duration
}

func (l clientListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return netbound.NewConn(c, l.d, clientWrites), nil
}

// stdIn is a net/http request as an inbound.
type stdIn http.Request

func (r *stdIn) Get(key string) string      { return lane.HTTPHeader(r.Header).Get(key) }
func (r *stdIn) Values(key string) []string { return lane.HTTPHeader(r.Header).Values(key) }
func (r *stdIn) Set(key, value string)      {}
func (r *stdIn) Del(key string)             {}
func (r *stdIn) hostHeader() string         { return r.Host }

func (r *stdIn) peer() netip.Addr {
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		return ap.Addr().Unmap().WithZone("")
	}
	if a, err := netip.ParseAddr(r.RemoteAddr); err == nil {
		return a.Unmap().WithZone("")
	}
	return netip.Addr{}
}

// stdFields is a net/http header map as fields.
type stdFields http.Header

func (h stdFields) Get(key string) string          { return lane.HTTPHeader(h).Get(key) }
func (h stdFields) Values(key string) []string     { return lane.HTTPHeader(h).Values(key) }
func (h stdFields) Set(key, value string)          { lane.HTTPHeader(h).Set(key, value) }
func (h stdFields) Del(key string)                 { lane.HTTPHeader(h).Del(key) }
func (h stdFields) setVals(key string, v []string) { h[key] = v }
func (h stdFields) setBytes(key string, v []byte)  { h[key] = []string{string(v)} }

// stdOut is a net/http ResponseWriter as a responder.
type stdOut struct{ w http.ResponseWriter }

func (o stdOut) header() fields         { return stdFields(o.w.Header()) }
func (o stdOut) writeHeader(status int) { o.w.WriteHeader(status) }
func (o stdOut) writeString(s string)   { o.w.Write([]byte(s)) }

// stripLaneHeaders removes from the outbound headers what a client sent
// about lanes and its address: x-lane, the alias headers and X-Real-IP, in
// any spelling that differs only by case or by '_' for '-' (x_lane), as a
// proxy or framework upstream may merge such spellings with the real one
// (CGI's HTTP_X_LANE, nginx with underscores_in_headers on). The gateway
// never reads those spellings. (The lane member of baggage is rewritten by
// the propagator, X-Real-IP set by forward.)
func (s *stdStack) stripLaneHeaders(h http.Header) {
	for k := range h {
		if s.g.strippedName(k) {
			delete(h, k)
		}
	}
}
