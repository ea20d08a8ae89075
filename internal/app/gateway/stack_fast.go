package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/lanesdev/lanes/internal/app/gateway/upstream"
	"github.com/lanesdev/lanes/internal/lib/addrpolicy"
	"github.com/lanesdev/lanes/internal/lib/netbound"
	"github.com/lanesdev/lanes/internal/lib/routedcall"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/routing"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
	"go.opentelemetry.io/otel/trace"
)

// The fast stack: fasthttp's server parses the client's request, the
// core's rules run over it (admit, assign, forward, writeLane, routed,
// callFailed, fail, and the framing rules), and the attempts go to the
// instance over the gateway's own keep-alive pools (upstream.go), which read
// the answer straight into the response that fasthttp writes. The server
// streams request bodies (Server.StreamRequestBody): the handler runs once
// the head is in, reads a small body of known length whole, and hands a
// larger or chunked one to the attempt, which copies it upstream as the
// client sends it (fastStack.takeBody). Requests that the stack does not
// serve itself go to the net/http stack's handler through fasthttpadaptor:
// upgrades (WebSocket), requests that ask for trailers (TE: trailers), and
// request targets other than an origin-form path.

// fastReq is the state of a request on the fast stack: the core's, the
// views of the fasthttp request that the rules read and write, the
// attempts, and the request's body.
type fastReq struct {
	reqState
	in   fastIn
	out  fastReqFields
	send fastSend
	// stream is the request's body while it streams (takeBody): the
	// core's body then.
	stream keptBody
	// bodyBuf holds a small request body (takeBody).
	bodyBuf []byte
}

func (f *fastStack) putReq(st *fastReq) {
	buf, bodyBuf := st.buf[:0], st.bodyBuf[:0]
	*st = fastReq{}
	st.buf, st.bodyBuf = buf, bodyBuf
	f.pool.Put(st)
}

// btoi is 1 for true, 0 for false.
func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// b2s views b as a string, without copying: valid as long as b is.
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// fastIn is a fasthttp request as an inbound: its strings live as long as
// the request.
type fastIn struct {
	ctx  *fasthttp.RequestCtx
	vals [4]string
}

func (f *fastIn) Get(key string) string { return b2s(f.ctx.Request.Header.Peek(key)) }

func (f *fastIn) Values(key string) []string {
	return viewAll(f.vals[:0], f.ctx.Request.Header.PeekAll(key))
}

func (f *fastIn) Set(key, value string) {}
func (f *fastIn) Del(key string)        {}
func (f *fastIn) hostHeader() string    { return b2s(f.ctx.Request.Header.Host()) }

func (f *fastIn) peer() netip.Addr {
	switch a := f.ctx.RemoteAddr().(type) {
	case *net.TCPAddr:
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return ip.Unmap()
		}
	case nil:
	default:
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			return ap.Addr().Unmap().WithZone("")
		}
	}
	return netip.Addr{}
}

func viewAll(dst []string, all [][]byte) []string {
	if len(all) == 0 {
		return nil
	}
	for _, v := range all {
		dst = append(dst, b2s(v))
	}
	return dst
}

// fastReqFields is a fasthttp request header as fields, and as the
// TextMapCarrier that OpenTelemetry writes the trace context to.
type fastReqFields struct {
	h    *fasthttp.RequestHeader
	vals [4]string
}

func (f *fastReqFields) Get(key string) string { return b2s(f.h.Peek(key)) }

func (f *fastReqFields) Values(key string) []string {
	return viewAll(f.vals[:0], f.h.PeekAll(key))
}

func (f *fastReqFields) Set(key, value string)             { f.h.Set(key, value) }
func (f *fastReqFields) Del(key string)                    { f.h.Del(key) }
func (f *fastReqFields) setBytes(key string, v []byte)     { f.h.SetBytesV(key, v) }
func (f *fastReqFields) setVals(key string, vals []string) { setAll(f.h, key, vals) }

func (f *fastReqFields) Keys() []string {
	var keys []string
	for k := range f.h.All() {
		keys = append(keys, string(k))
	}
	return keys
}

// setAll replaces the values of key in h with vals, which may be views of h's
// own values: they are copied before h changes.
func setAll(h interface {
	Set(key, value string)
	Add(key, value string)
	Del(key string)
}, key string, vals []string) {

	switch len(vals) {
	case 0:
		h.Del(key)
	case 1:
		h.Set(key, vals[0])
	default:
		own := make([]string, len(vals))
		for i, v := range vals {
			own[i] = strings.Clone(v)
		}
		h.Del(key)
		for _, v := range own {
			h.Add(key, v)
		}
	}
}

// fastRespFields is a fasthttp response header as fields.
type fastRespFields fasthttp.ResponseHeader

func (f *fastRespFields) h() *fasthttp.ResponseHeader    { return (*fasthttp.ResponseHeader)(f) }
func (f *fastRespFields) Get(key string) string          { return b2s(f.h().Peek(key)) }
func (f *fastRespFields) Values(key string) []string     { return viewAll(nil, f.h().PeekAll(key)) }
func (f *fastRespFields) Set(key, value string)          { f.h().Set(key, value) }
func (f *fastRespFields) Del(key string)                 { f.h().Del(key) }
func (f *fastRespFields) setBytes(key string, v []byte)  { f.h().SetBytesV(key, v) }
func (f *fastRespFields) setVals(key string, v []string) { setAll(f.h(), key, v) }

// fastOut is a fasthttp response as a responder.
type fastOut fasthttp.RequestCtx

func (o *fastOut) header() fields         { return (*fastRespFields)(&o.Response.Header) }
func (o *fastOut) writeHeader(status int) { o.Response.SetStatusCode(status) }
func (o *fastOut) writeString(s string)   { o.Response.AppendBodyString(s) }

// fastStack is the fasthttp stack of a gateway.
type fastStack struct {
	g *Gateway
	// std is the net/http stack: it serves the HTTP/2 connections, and
	// the requests that this stack hands over (adapt) through adaptor.
	std     *stdStack
	adaptor fasthttp.RequestHandler
	// up are the keep-alive pools to instances.
	up      *upstream.Client
	pool    sync.Pool // *fastReq
	servers serverSet[*fastServer]
}

func newFastStack(g *Gateway, std *stdStack, dial *addrpolicy.Rules) *fastStack {
	f := &fastStack{g: g, std: std, up: upstream.New(upstream.Options{MaxIdlePerHost: g.idle, IdleTimeout: g.upIdle,
		WriteTimeout: g.writeTimeout, ReadTimeout: g.readTimeout, Dial: dial})}
	f.adaptor = fasthttpadaptor.NewFastHTTPHandler(http.HandlerFunc(f.serveAdapted))
	f.pool.New = func() any { return new(fastReq) }
	return f
}

// route is what the fast path does with a request (see classify).
type fastRoute uint8

const (
	fastServe fastRoute = iota // serve it here
	fastStd                    // hand it to the net/http handler
	fastBad                    // refuse its request target with 400
)

// classify tells what the fast path does with the request of ctx: it hands
// an upgrade, a request with a TE header and a request target other than an
// origin-form path to the net/http handler, refuses a target that net/http
// refuses (control characters, bad escapes) as net/http does, with 400, and
// serves the rest. For those it returns the request's path, percent-decoded
// as net/http's URL.Path.
func classify(ctx *fasthttp.RequestCtx) (path string, r fastRoute) {
	h := &ctx.Request.Header
	uri := h.RequestURI()
	if len(uri) == 0 || uri[0] != '/' {
		if _, err := url.ParseRequestURI(string(uri)); err != nil {
			return "", fastBad
		}
		return "", fastStd
	}
	for _, c := range uri {
		if c < 0x20 || c == 0x7f {
			return "", fastBad // net/url: invalid control character in URL
		}
	}
	if len(h.Peek("Upgrade")) > 0 || len(h.Peek("Te")) > 0 {
		return "", fastStd
	}
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		uri = uri[:i]
	}
	if bytes.IndexByte(uri, '%') < 0 {
		return b2s(uri), fastServe
	}
	p, err := url.PathUnescape(string(uri))
	if err != nil {
		return "", fastBad
	}
	return p, fastServe
}

// spaceInName reports whether a header field name of h holds a space:
// fasthttp's server takes a name with a space inside it (though no other
// byte outside a token), which is no field name (RFC 9110 5.1), which
// net/http's server refuses, and which a peer behind the gateway may read as
// a shorter name ("Transfer-Encoding x: chunked") or as a line of its own.
func spaceInName(h *fasthttp.RequestHeader) bool {
	for k := range h.All() {
		if bytes.IndexByte(k, ' ') >= 0 {
			return true
		}
	}
	return false
}

// droppedTE reports whether the head of h has a Transfer-Encoding field
// that fasthttp's server dropped: it reads "identity" (RFC 2616's coding,
// which RFC 9112 no longer has) as no coding, drops the field, and leaves
// the body to a Content-Length, or to none. RFC 9112 6.3 asks a server to
// refuse a request whose final transfer coding is not chunked (net/http's
// answers 501): a peer in front of the gateway that reads identity as RFC
// 2616 did takes the rest of the connection as the body, where the gateway
// would read it as requests. fasthttp keeps the chunked coding (a
// Content-Length of -1) and refuses any other; only the raw head shows an
// identity that it dropped.
func droppedTE(h *fasthttp.RequestHeader) bool {
	if h.ContentLength() == -1 {
		return false
	}
	const name = "transfer-encoding"
	raw := h.RawHeaders()
	for off := 0; ; {
		i := bytes.IndexByte(raw[off:], ':')
		if i < 0 {
			return false
		}
		i += off
		if start := i - len(name); start >= 0 && (start == 0 || raw[start-1] == '\n') && strings.EqualFold(b2s(raw[start:i]), name) {
			return true
		}
		off = i + 1
	}
}

// hopHeaders are the hop-by-hop headers that a proxy does not forward (RFC
// 9110 7.6.1), as httputil.ReverseProxy removes them; Expect is answered by
// the fast path's server, which asks for the body before the handler runs.
var hopHeaders = [...]string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",

	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Expect"}

// delHop removes the hop-by-hop headers from a request's headers h, and
// the headers that its Connection header names. One pass finds them; most
// requests have none. With keepTrailer it keeps the Trailer header of a
// chunked body that streams: it announces the trailers that follow the
// body, which go on after it (as net/http's transport announces the
// trailers of a request that ReverseProxy forwards).
func delHop(h *fasthttp.RequestHeader, keepTrailer bool) {
	var found [len(hopHeaders)]bool
	n := 0
	for k := range h.All() {
		n += findHop(&found, k, keepTrailer)
	}
	if n > 0 {
		dropHop(h, &found)
	}
}

// delHopAnswer is delHop for an answer, which keeps its Trailer header: it
// announces the trailers that the fast path passes on (as ReverseProxy
// announces them).
func delHopAnswer(h *fasthttp.ResponseHeader) {
	var found [len(hopHeaders)]bool
	n := 0
	for k := range h.All() {
		n += findHop(&found, k, true)
	}
	if n > 0 {
		dropHop(h, &found)
	}
}

// findHop marks the hop-by-hop header named k in found, but Trailer with
// keepTrailer.
func findHop(found *[len(hopHeaders)]bool, k []byte, keepTrailer bool) int {
	for i, name := range hopHeaders {
		if len(k) == len(name) && strings.EqualFold(b2s(k), name) && !(keepTrailer && name == "Trailer") {
			found[i] = true
			return 1
		}
	}
	return 0
}

// dropHop removes the headers that found marks, and those that Connection
// names.
func dropHop(h interface {
	Peek(key string) []byte
	Del(key string)
}, found *[len(hopHeaders)]bool) {

	if found[0] {
		for _, f := range bytes.Split(h.Peek("Connection"), []byte{','}) { // rare: allocates
			if f = bytes.TrimSpace(f); len(f) > 0 {
				h.Del(string(f))
			}
		}
	}
	for i, k := range hopHeaders {
		if found[i] {
			h.Del(k)
		}
	}
}

// malformed refuses a request that fasthttp's server took but the gateway
// does not (msg says why): 400 bad_request, counted, and the connection
// closed, as the server refuses a head it cannot parse (Gateway.refuse).
func (f *fastStack) malformed(ctx *fasthttp.RequestCtx, msg string) {
	ctx.SetConnectionClose()
	f.g.m.errors(codeBadRequest)
	f.g.fail((*fastOut)(ctx), false, http.StatusBadRequest, codeBadRequest, msg)
}

// handle is the fast stack's fasthttp handler.
func (f *fastStack) handle(ctx *fasthttp.RequestCtx) {
	path, how := classify(ctx)
	switch how {
	case fastStd:
		f.adapt(ctx)
		return
	case fastBad:
		// As net/http's server refuses a target it cannot parse.
		f.malformed(ctx, "lanes: malformed request target")
		return
	}
	if spaceInName(&ctx.Request.Header) || droppedTE(&ctx.Request.Header) {
		f.malformed(ctx, "lanes: malformed request")
		return
	}
	g := f.g
	out := (*fastOut)(ctx)
	if !g.enter() {
		g.closingAnswer(out, false)
		return
	}
	handedOver := false // to untilClose, which exits in its turn
	defer func() {
		if !handedOver {
			g.exit()
		}
	}()
	// The client's Connection: close, and the framing rules
	// (Gateway.closeAfter), close the connection after the answer. The
	// answer is read into ctx.Response, which resets it: this is set last.
	frame := framingOf(1, btoi(ctx.Request.Header.IsHTTP11()), ctx.Request.Header.ContentLength() == -1)
	closeAfter := ctx.Request.Header.ConnectionClose()
	defer func() {
		if closeAfter || g.closeAfter(frame) {
			ctx.SetConnectionClose()
		}
	}()
	st := f.pool.Get().(*fastReq)
	defer f.putReq(st)
	st.in.ctx = ctx
	if !g.admit(ctx, &st.reqState, &st.in, path, out) {
		return
	}
	bodyless, ok := f.takeBody(ctx, st)
	if !ok {
		closeAfter = true
		return
	}
	defer func() {
		if st.body != nil && !st.body.eof.Load() {
			// A body that streams and was not read through (the
			// instance failed, or answered, before its end): the rest
			// is not waited for.
			closeAfter = true
			lingerClose(ctx)
		}
	}()
	resp := &ctx.Response
	var span trace.Span
	var callCtx context.Context = ctx
	if g.tracer != nil {
		method, p := string(ctx.Method()), strings.Clone(path) // the span outlives the request
		callCtx, span = g.entrySpan(lane.WithLane(context.Background(), st.req.Lane), method, p, st.req.Lane)
		defer func() {
			traceHeaders((*fastRespFields)(&resp.Header), span)
			span.End()
		}()
	}

	// The outbound request is the client's, rewritten in place once the
	// rules above have read it: less the hop-by-hop and lane headers, with
	// the forwarding headers, in HTTP/1.1. Nothing reads the client's
	// request after this but the attempts.
	preserve := g.preserve && len(ctx.Request.Header.Host()) > 0
	idem := idempotent(b2s(ctx.Method()), &st.in)
	req := &ctx.Request
	// The target and Host go as the header holds them, not as the server's
	// parsed URI would write them again.
	req.SetRequestURIBytes(req.Header.RequestURI())
	req.UseHostHeader = true
	req.Header.SetNoDefaultContentType(true)
	to1xx := ctx // the client that 1xx answers go on to
	if !frame.passInterim() {
		to1xx = nil
	}
	if !req.Header.IsHTTP11() {
		req.Header.SetProtocol("HTTP/1.1")
	}
	delHop(&req.Header, st.body != nil && st.body.size == -1)
	st.out.h = &req.Header
	f.stripLaneHeaders(&req.Header)
	g.forward(&st.out, &st.in, &st.reqState, false)
	if st.route.StripPrefix {
		stripTarget(&req.Header, st.route.prefix)
	}

	s := &st.send
	*s = fastSend{g: g, up: f.up, st: st, req: req, resp: resp, out: &st.out, ctx: ctx, callCtx: callCtx, to1xx: to1xx, bodyless: bodyless, preserve: preserve}
	err := g.routed(callCtx, &st.reqState, methodName(ctx.Method()), idem, s)
	if err == nil {
		err = s.err
	}
	if err != nil {
		resp.Reset()
		g.laneHeaders(&st.reqState, out.header())
		g.callFailed(out, &st.reqState, err, false)
		return
	}
	delHopAnswer(&resp.Header)
	g.laneHeaders(&st.reqState, out.header())
	g.m.served(st.pick().Lane)
	if unframed(resp, frame.http10) {
		handedOver = true
		f.untilClose(ctx, true)
	}
}

// unframed reports whether resp is an answer to an HTTP/1.0 client (http10)
// that streams with no length known, which untilClose sends.
func unframed(resp *fasthttp.Response, http10 bool) bool {
	return http10 && resp.IsBodyStream() && resp.Header.ContentLength() < 0 && !resp.SkipBody
}

// untilClose sends the answer of ctx, which streams and whose length is not
// known (a chunked answer, or one that the instance ends by closing its
// connection), to an HTTP/1.0 client as net/http's server does: as it
// comes, ended by the end of the connection. fasthttp's server would send
// it chunked, a coding that HTTP/1.0 does not have (RFC 9112 6.1: a server
// sends no Transfer-Encoding to an HTTP/1.0 request), and a client that
// takes the body as it comes would read the chunks' framing as the body.
//
// The server runs it once it has sent the answers before this one
// (fasthttp's Hijack), after the handler has returned. With exit (from
// serve) it holds the request's place among those in flight (Gateway.enter)
// until the answer's end, so that Close and Shutdown wait for it as for any
// other request; on the net/http handler's route (adapt) the handler holds
// it, as it writes the answer. Each write is bounded by the client write
// timeout (prefixConn), each read by the upstream read timeout (upConn).
//
// An answer that the instance cuts short ends with a reset of the client's
// connection (reset), as the net/http stack's (resetOnAbort): ended as a whole answer ends, it
// would look whole.
func (f *fastStack) untilClose(ctx *fasthttp.RequestCtx, exit bool) {
	resp := &ctx.Response
	resp.Header.Del(fasthttp.HeaderTransferEncoding) // the adaptor's chunked
	resp.Header.SetContentLength(-2)                 // no length, no coding; Connection: close
	client := ctx.Conn()
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		if exit {
			defer f.g.exit()
		}
		defer resp.CloseBodyStream() // the upstream connection goes back, or is closed if cut
		if _, err := c.Write(resp.Header.Header()); err != nil {
			return
		}
		// Each part goes on as it comes (an event stream waits on it), as
		// fasthttp's server flushes each chunk.
		body, buf := resp.BodyStream(), make([]byte, 32<<10)
		for {
			n, err := body.Read(buf)
			if n > 0 {
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err == io.EOF {
				return
			}
			if err != nil {
				reset(client)
				return
			}
		}
	})
}

// methodName is the method m as a string, without a copy for the usual
// ones: the client span's name, which outlives the request's buffers.
func methodName(m []byte) string {
	switch string(m) {
	case "GET":
		return "GET"
	case "HEAD":
		return "HEAD"
	case "POST":
		return "POST"
	case "PUT":
		return "PUT"
	case "DELETE":
		return "DELETE"
	case "PATCH":
		return "PATCH"
	case "OPTIONS":
		return "OPTIONS"
	}
	return string(m)
}

// stripLaneHeaders removes from h what the net/http stack's
// stripLaneHeaders removes from a net/http header (Gateway.strippedName):
// without allocating, unless a look-alike spelling is there.
func (f *fastStack) stripLaneHeaders(h *fasthttp.RequestHeader) {
	g := f.g
	for _, name := range g.stripped {
		h.Del(name)
	}
	var odd []string
	for k := range h.All() {
		if g.strippedName(b2s(k)) {
			odd = append(odd, string(k))
		}
	}
	for _, k := range odd {
		h.Del(k)
	}
}

// stripTarget removes the route's prefix p from the request target of h,
// as stripURL does from a net/http request's URL.
func stripTarget(h *fasthttp.RequestHeader, p string) {
	uri := b2s(h.RequestURI())
	rawPath, query, hasQuery := strings.Cut(uri, "?")
	u := url.URL{Path: rawPath}
	if strings.IndexByte(rawPath, '%') >= 0 {
		pu, err := url.ParseRequestURI(uri)
		if err != nil {
			return
		}
		u = *pu
		u.RawQuery, u.ForceQuery = "", false
	}
	stripURL(&u, p)
	target := u.EscapedPath()
	if hasQuery {
		target += "?" + query
	}
	h.SetRequestURI(target)
}

// fastSend sends the attempts of a fasthttp request.
type fastSend struct {
	g        *Gateway
	up       *upstream.Client
	st       *fastReq
	ctx      *fasthttp.RequestCtx
	to1xx    *fasthttp.RequestCtx // ctx, or nil when 1xx answers do not go on (framing.passInterim)
	req      *fasthttp.Request
	resp     *fasthttp.Response
	out      *fastReqFields
	callCtx  context.Context // the call's context: a client span's parent
	sent     bool            // an attempt was made
	bodyless bool
	preserve bool // send the client's Host
	err      error
}

func (s *fastSend) Send(ctx context.Context, pick routing.Result) routedcall.Attempt {
	s.g.attempting(&s.st.reqState, pick, !s.sent, s.err)
	s.sent = true
	if !s.preserve {
		s.req.Header.SetHost(pick.Instance.Addr)
	}
	s.g.writeLane(s.out, pick.RequestLane, s.st.req.Key)
	if ctx != s.callCtx { // the client span's
		traceContext.Inject(ctx, s.out)
	}
	if !upstream.Rewind(bodyOf(s.st.body), s.req) {
		// Not reached: replayable allows no attempt after one that read
		// the body.
		s.err = errBodyGone
		return attempt(&s.st.reqState, 0, "", s.err, false)
	}
	var unsent bool
	call := upstream.Call{HeaderTimeout: s.g.headerTimeout, Body: bodyOf(s.st.body)}
	if s.to1xx != nil {
		call.Interim = s
	}
	unsent, s.err = s.up.RoundTrip(pick.Instance.Addr, s.req, s.resp, call)
	if s.err != nil {
		a := attempt(&s.st.reqState, 0, "", s.err, unsent)
		// An attempt that Close cut short says nothing about the instance,
		// as net/http's Close, which cancels the request, says nothing.
		a.CallerGone = a.CallerGone || s.g.closing.Load()
		return a
	}
	if s.resp.IsBodyStream() {
		// The body streams after the handler returns, and st with it.
		note := stallNote{g: s.g, service: s.st.route.Service, pick: pick}
		upstream.OnStall(s.resp, func(err *upstream.ReadTimeoutError) { note.report(err) })
	}
	return attempt(&s.st.reqState, s.resp.StatusCode(), b2s(s.resp.Header.Peek(hError)), nil, false)
}

func (s *fastSend) Replayable(o routedcall.Outcome) bool {
	return replayable(o, s.bodyless, s.st.body)
}

// errBodyGone is an attempt of a request whose streamed body an earlier
// attempt read.
var errBodyGone = errors.New("the request body was partly sent already")

// bufferedRequestBody is the largest request body of known length that the
// fast path reads whole before the attempts, as it fits the server's read
// buffer: it can be sent again after an attempt that did not send it.
// Larger bodies, and chunked ones, stream.
const bufferedRequestBody = 16 << 10

// takeBody readies the body of the request of ctx for the attempts, and
// reports whether there is none: a body of known length up to
// bufferedRequestBody is read whole, into st (the server has read its first
// part with the head); a larger one, or a chunked one, goes on the request
// as a stream, through st.body (st.stream), which the attempt copies
// upstream as the client sends it (keeping its framing: Content-Length, or
// chunks and their trailers). When a small body does not arrive whole, it answers as the
// server answers a body it cannot read (Gateway.refuse) and returns ok
// false.
func (f *fastStack) takeBody(ctx *fasthttp.RequestCtx, st *fastReq) (bodyless, ok bool) {
	req := &ctx.Request
	stream := req.BodyStream()
	if stream == nil {
		return len(req.Body()) == 0, true
	}
	switch n := req.Header.ContentLength(); {
	case n == 0:
		req.ResetBody()
		return true, true
	case n > 0 && n <= bufferedRequestBody:
		if cap(st.bodyBuf) < n {
			st.bodyBuf = make([]byte, n, bufferedRequestBody)
		}
		b := st.bodyBuf[:n]
		if _, err := io.ReadFull(stream, b); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			f.refuse(ctx, err)
			return false, false
		}
		req.SetBodyRaw(b)
	default:
		st.stream = keptBody{r: stream, size: n, conn: ctx, d: f.g.clientRead}
		st.body = &st.stream
		req.SetBodyStream(st.body, n)
	}
	return false, true
}

// bodyOf is b as the upstream client's Body: nil for none.
func bodyOf(b *keptBody) upstream.Body {
	if b == nil {
		return nil
	}
	return b
}

// Interim passes a 1xx answer of the instance's, h, on to the client,
// without the instance's lane headers (upstream.Interim).
func (s *fastSend) Interim(h *fasthttp.ResponseHeader) error {
	interimHeaders((*fastRespFields)(h))
	_, err := s.to1xx.Conn().Write(h.Header())
	return err
}

// adapt hands the request of ctx to the net/http handler (ServeHTTP)
// through fasthttpadaptor, with its body as it streams: the adaptor would
// read it whole first (ctx.PostBody), so a body that streams is taken off
// the request, where the adaptor finds none, and lent to the handler as an
// adaptedBody (serveAdapted). The server still owns the stream: after the
// answer it drains what the handler left of it, or closes the connection.
func (f *fastStack) adapt(ctx *fasthttp.RequestCtx) {
	req := &ctx.Request
	if stream := req.BodyStream(); stream != nil {
		b := &adaptedBody{ctx: ctx}
		b.kb = keptBody{r: stream, size: req.Header.ContentLength(), conn: b, d: f.g.clientRead}
		req.ResetBody()
		ctx.SetUserValue(adaptedKey{}, b)
	}
	http10 := !req.Header.IsHTTP11()
	f.adaptor(ctx)
	if unframed(&ctx.Response, http10) {
		// The adaptor streams an answer that the handler flushed, chunked.
		f.untilClose(ctx, false)
	}
}

// adaptedKey is the user value of a request's adaptedBody.
type adaptedKey struct{}

// serveAdapted is the net/http handler of the requests that the fast path
// hands over (adapt): the gateway's, with the request's body as it streams,
// with an answer that streams once it is over upstream.MaxBufferedBody
// (streamingWriter), where fasthttpadaptor would hold it whole, and with an
// answer that the instance cut (adaptedServer) cut for the client too.
func (f *fastStack) serveAdapted(w http.ResponseWriter, r *http.Request) {
	if b, ok := r.Context().Value(adaptedKey{}).(*adaptedBody); ok {
		r.Body, r.ContentLength, b.trailer = b, int64(b.kb.size), r.Trailer
		defer b.Close()
	}
	r = r.WithContext(context.WithValue(r.Context(), http.ServerContextKey, adaptedServer))
	f.std.ServeHTTP(&streamingWriter{ResponseWriter: w}, r)
}

// adaptedServer is the server that the context of a request handed to the
// net/http handler names (http.ServerContextKey), as net/http's server
// names itself: httputil.ReverseProxy aborts an answer whose body it could
// not copy whole (the instance stalled past the upstream read timeout, or
// reset the connection, in the middle of it) with http.ErrAbortHandler only
// under a server; without one it returns as if the answer were whole, and
// fasthttpadaptor would send what it had of it as a whole answer (a short
// body with a Content-Length of its size, or a chunked body with its last
// chunk). fasthttpadaptor recovers the abort and cuts the answer: it
// closes the connection without any of it when it held it all, and without
// the last chunk when it had flushed it (streamingWriter, or an answer of
// unknown length, which ReverseProxy flushes as it comes). Nothing reads
// the server's fields.
var adaptedServer = new(http.Server)

// adaptedBody is the body of a request that the fast path hands to the
// net/http handler, read as it streams from the client (keptBody: each read
// within the client read timeout; a body shorter than its Content-Length fails). Like
// net/http's server, it is closed when the handler returns (Close): the
// transport may still be reading it then (an instance answered before it
// took the whole body), and that read is cut short, and waited for, since
// the server reads the connection again once the handler is done. The
// trailers of a chunked body are filled in once it is read through, as
// net/http's server fills them.
type adaptedBody struct {
	ctx     *fasthttp.RequestCtx
	mu      sync.Mutex // held by a read
	kb      keptBody
	trailer http.Header // the request's trailers, announced
	dl      sync.Mutex  // orders SetReadDeadline and Close
	closed  bool        // under dl
}

// errBodyClosed is a read of an adaptedBody after its handler returned.
var errBodyClosed = errors.New("lanes gateway: read of a request body after its handler returned")

func (b *adaptedBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dl.Lock()
	closed := b.closed
	b.dl.Unlock()
	if closed {
		return 0, errBodyClosed
	}
	n, err := b.kb.Read(p)
	if err == io.EOF {
		for k := range b.trailer {
			if v := b.ctx.Request.Header.PeekTrailer(k); v != nil {
				b.trailer[k] = []string{string(v)}
			}
		}
	}
	return n, err
}

// SetReadDeadline sets the client connection's read deadline before each
// read (keptBody.conn): once the body is closed, to now, so that a read
// that starts then ends at once.
func (b *adaptedBody) SetReadDeadline(t time.Time) error {
	b.dl.Lock()
	defer b.dl.Unlock()
	if b.closed {
		t = time.Now()
	}
	return b.ctx.SetReadDeadline(t)
}

// Close ends the body: later reads fail, and a read in flight is cut short
// (its connection closes after the answer, the body unread) and waited for.
func (b *adaptedBody) Close() error {
	b.dl.Lock()
	if b.closed {
		b.dl.Unlock()
		return nil
	}
	b.closed = true
	cut := !b.mu.TryLock()
	if cut {
		b.ctx.SetReadDeadline(time.Now())
	}
	b.dl.Unlock()
	if cut {
		b.mu.Lock()
	}
	b.mu.Unlock()
	return nil
}

// streamingWriter is the net/http handler's ResponseWriter on the fast
// path: fasthttpadaptor holds an answer whole until the handler flushes or
// returns, and this flushes once the body written is over upstream.MaxBufferedBody,
// so that a large answer streams, as the fast path's own answers do. It
// unwraps (http.ResponseController) to the adaptor's writer, which flushes
// and hijacks.
type streamingWriter struct {
	http.ResponseWriter
	n int
}

func (w *streamingWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	if w.n <= upstream.MaxBufferedBody {
		if w.n += n; w.n > upstream.MaxBufferedBody {
			http.NewResponseController(w.ResponseWriter).Flush()
		}
	}
	return n, err
}

func (w *streamingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *fastSend) Drop() {
	s.resp.Reset()
	s.err = nil
}

// h2Preface opens every HTTP/2 connection with prior knowledge (h2c, gRPC).
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// fastServer is one Serve call of the fast path: its listener, the HTTP/1.1
// connections it serves on fasthttp, and the listener that hands HTTP/2
// connections to a net/http server.
type fastServer struct {
	ln    net.Listener
	h2    *chanListener
	fs    *fasthttp.Server
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	// idle are the HTTP/1.1 connections being served, each true while it
	// waits for a request (ConnState), under mu; draining is set once
	// Shutdown began: an idle connection is then ended (prefixConn.expire).
	idle     map[*prefixConn]bool
	sniffing map[net.Conn]struct{} // read for the HTTP/2 preface (sniff)
	draining bool
	wg       sync.WaitGroup // the connection goroutines
	// clientWrite is the client write timeout, 0 for none.
	clientWrite time.Duration
	// headTimeout is the client header timeout.
	headTimeout time.Duration
}

// bodyTimeout is fasthttp's HeaderReceived: once a head is in, the read of
// a small body with it may take the client read timeout (the head took at
// most the client header timeout); a body that streams has each read
// bounded by it (keptBody).
func (f *fastStack) bodyTimeout(*fasthttp.RequestHeader) fasthttp.RequestConfig {
	return fasthttp.RequestConfig{ReadTimeout: orForever(f.g.clientRead)}
}

// serveFast is Serve on the fast path: it accepts connections on ln, hands
// those that open with the HTTP/2 preface to a net/http server (h2c and
// gRPC, as the net/http path serves them) and serves the others on
// fasthttp, each on its own goroutine, until Close or Shutdown.
func (f *fastStack) serve(ln net.Listener) error {
	g := f.g
	s := &fastServer{headTimeout: g.clientHeader, ln: ln, h2: newChanListener(ln.Addr()), conns: map[net.Conn]struct{}{}, clientWrite: g.clientWrite}
	s.fs = &fasthttp.Server{
		Handler:                      f.handle,
		Name:                         "",
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		NoDefaultDate:                true,
		DisablePreParseMultipartForm: true,
		ReadBufferSize:               maxHeaderBytes, // fasthttp's bound on a request head
		WriteBufferSize:              16 << 10,
		// ReadTimeout bounds the read of a head (the first request's
		// from where sniff started, see prefixConn.headBy); once it is
		// in, HeaderReceived gives the body the client read timeout.
		ReadTimeout:    g.clientHeader,
		HeaderReceived: f.bodyTimeout,
		IdleTimeout:    orForever(g.clientIdle), // fasthttp's 0 is ReadTimeout
		// Request bodies stream: the handler runs once the head is in
		// (fastStack.takeBody); with streaming, MaxRequestBodySize is no
		// limit, only how much of a body fasthttp may read with the head.
		StreamRequestBody:  true,
		MaxRequestBodySize: bufferedRequestBody,
		ErrorHandler:       f.refuse,
		Logger:             fastLogger{g.log},
		ConnState:          s.connState,
	}
	if !f.servers.add(&g.closing, ln, s) {
		return http.ErrServerClosed
	}
	f.up.Start() // release stops it

	h2done := make(chan struct{})
	go func() {
		defer close(h2done)
		f.std.serveH2C(s.h2)
	}()
	// ln backs off on temporary errors (Serve wrapped it): any error
	// ends the loop.
	var err error
	for {
		c, aerr := ln.Accept()
		if aerr != nil {
			err = aerr
			break
		}
		if !s.track(c) {
			c.Close()
			continue
		}
		s.wg.Add(1)
		go s.serveConn(c)
	}
	s.h2.Close()
	<-h2done
	s.mu.Lock()
	draining := s.draining
	s.mu.Unlock()
	if !draining {
		s.closeConns()
	}
	// Draining (Shutdown), the connections end once their requests are
	// answered (Gateway.closeAfter), the idle ones at once (drain); Close
	// closes what is left.
	s.wg.Wait()
	f.servers.remove(s)
	if g.closing.Load() {
		return http.ErrServerClosed
	}
	return err
}

// connState follows the connections that fasthttp serves (its ConnState):
// an idle one waits for a request, an active one serves one. Draining, a
// connection that goes idle is ended.
func (s *fastServer) connState(c net.Conn, state fasthttp.ConnState) {
	pc, ok := c.(*prefixConn)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch state {
	case fasthttp.StateActive:
		if s.idle != nil {
			s.idle[pc] = false
		}
	case fasthttp.StateIdle:
		if s.draining {
			pc.expire()
		} else if s.idle != nil {
			s.idle[pc] = true
		}
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		delete(s.idle, pc)
	}
}

// drain ends Serve gracefully: it closes the listener, and ends the
// connections that wait for a request; those that serve one end after
// their answer, which says Connection: close while the gateway closes.
func (s *fastServer) drain() {
	s.mu.Lock()
	s.draining = true
	var idle []*prefixConn
	for pc, waiting := range s.idle {
		if waiting {
			idle = append(idle, pc)
		}
	}
	// A connection still read for the HTTP/2 preface has sent no
	// request: it is closed, as net/http's Shutdown closes a new one.
	for c := range s.sniffing {
		c.Close()
	}
	s.mu.Unlock()
	s.ln.Close()
	for _, pc := range idle {
		pc.expire()
	}
}

func (s *fastServer) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conns == nil {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *fastServer) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// closeConns closes every connection and refuses new ones.
func (s *fastServer) closeConns() {
	s.mu.Lock()
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	for c := range conns {
		c.Close()
	}
}

// stop ends Serve: the listener, then the connections.
func (s *fastServer) stop() {
	s.ln.Close()
	s.closeConns()
}

// serveConn sniffs c's first bytes and serves it.
func (s *fastServer) serveConn(c net.Conn) {
	defer s.wg.Done()
	s.mu.Lock()
	if s.sniffing == nil {
		s.sniffing = map[net.Conn]struct{}{}
	}
	s.sniffing[c] = struct{}{}
	draining := s.draining
	s.mu.Unlock()
	if draining {
		s.untrack(c)
		c.Close()
		return
	}
	pc, h2, err := sniff(c, s.headTimeout)
	s.mu.Lock()
	delete(s.sniffing, c)
	s.mu.Unlock()
	if err != nil {
		s.untrack(c)
		c.Close()
		return
	}
	pc.w = netbound.Writer{C: c, D: s.clientWrite, Names: clientWrites}
	if h2 {
		// The net/http server owns the connection from here; Close
		// closes it through that server.
		s.untrack(c)
		s.h2.push(pc)
		return
	}
	// ServeConn closes pc, unless a request hijacked it (an upgrade):
	// then whoever holds it does. Either way pc leaves the set when closed.
	pc.s = s
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		pc.Close()
		return
	}
	if s.idle == nil {
		s.idle = map[*prefixConn]bool{}
	}
	s.idle[pc] = true // until its first request
	s.mu.Unlock()
	s.fs.ServeConn(pc)
}

// sniff reads the first bytes of c, within the head timeout d, until they
// are the HTTP/2 preface or cannot be, and returns c with them to be read
// again. An HTTP/1.1 connection keeps the deadline for the rest of its
// first head (prefixConn.headBy).
func sniff(c net.Conn, d time.Duration) (*prefixConn, bool, error) {
	var headBy time.Time // none without a client header timeout
	if d > 0 {
		headBy = time.Now().Add(d)
	}
	c.SetReadDeadline(headBy)
	var buf [len(h2Preface)]byte
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if string(buf[:n]) != h2Preface[:n] {
			break
		}
		if err != nil {
			if n == 0 {
				return nil, false, err
			}
			break
		}
	}
	h2 := n == len(h2Preface) && string(buf[:n]) == h2Preface
	pc := &prefixConn{Conn: c}
	if h2 {
		c.SetReadDeadline(time.Time{}) // net/http's server sets its own
	} else {
		pc.headBy = headBy
	}
	pc.prefix = append(pc.buf[:0], buf[:n]...)
	return pc, h2, nil
}

// prefixConn is a connection whose first bytes, already read, are read
// again.
type prefixConn struct {
	net.Conn
	prefix []byte
	buf    [len(h2Preface)]byte
	s      *fastServer // untracks the connection when closed
	armed  time.Time   // the read deadline set, on fasthttp's connections
	// linger has Close end the connection as net/http's server ends one
	// whose request body it did not read through (see lingerClose).
	linger bool
	// w bounds each write of an answer by the client write timeout.
	w netbound.Writer
	// headBy is the deadline of the first request's head, set when the
	// connection opened (sniff): fasthttp's first deadline, its read
	// timeout counted from when it starts, keeps it, so that the head
	// takes the client header timeout in all.
	headBy time.Time
	// expired is set once a draining server ended the connection while
	// it waited for a request: every read deadline is now.
	expired atomic.Bool
}

// expire ends a connection that waits for a request (fastServer.drain):
// its read fails at once, and fasthttp closes it.
func (c *prefixConn) expire() {
	c.expired.Store(true)
	c.Conn.SetReadDeadline(time.Now())
}

// Write writes to the client, each write within the client write timeout.
func (c *prefixConn) Write(p []byte) (int, error) { return c.w.Write(p) }

// NetConn returns the connection that c wraps, as tls.Conn.NetConn does.
func (c *prefixConn) NetConn() net.Conn { return c.Conn }

// SetReadDeadline sets the read deadline, but on fasthttp's connections keeps
// one already set that falls at most a second before t: fasthttp sets two
// each request (the idle timeout, then the read timeout, both minutes long),
// and setting one is a runtime timer update. Its timeouts thus last up to a
// second less than configured, never more.
func (c *prefixConn) SetReadDeadline(t time.Time) error {
	if c.expired.Load() {
		return c.Conn.SetReadDeadline(time.Now())
	}
	if !c.headBy.IsZero() {
		by := c.headBy
		c.headBy = time.Time{}
		if !t.IsZero() && t.After(by) {
			c.armed = by
			return nil
		}
	}
	if c.s != nil && !t.IsZero() && !c.armed.IsZero() && !c.armed.After(t) && t.Sub(c.armed) <= time.Second {
		return nil
	}
	err := c.Conn.SetReadDeadline(t)
	if c.s != nil {
		c.armed = t
	}
	return err
}

// SetDeadline sets both deadlines, as net.Conn's does.
func (c *prefixConn) SetDeadline(t time.Time) error {
	if c.s != nil {
		c.armed = t
	}
	return c.Conn.SetDeadline(t)
}

func (c *prefixConn) Close() error {
	if c.linger {
		c.linger = false
		if tc := tcpConn(c.Conn); tc != nil {
			// Still tracked: the gateway's Close ends the wait.
			tc.CloseWrite()
			tc.SetReadDeadline(time.Now().Add(lingerTimeout))
			io.Copy(io.Discard, tc)
		}
	}
	if c.s != nil {
		c.s.untrack(c.Conn)
	}
	return c.Conn.Close()
}

// lingerTimeout bounds how long a connection closed with its request body
// unread waits for the client to stop sending (as net/http's server waits
// 500ms).
const lingerTimeout = 500 * time.Millisecond

// lingerClose closes the connection of ctx after the answer, which is sent
// before all of the request's body was read (the instance answered early,
// or failed): it closes its side first and reads what the client still
// sends, for up to lingerTimeout or until the client closes, so that the
// connection does not reset under the answer before the client reads it.
func lingerClose(ctx *fasthttp.RequestCtx) {
	ctx.SetConnectionClose()
	if pc, ok := ctx.Conn().(*prefixConn); ok && pc.s != nil {
		pc.linger = true
	}
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// chanListener is a net.Listener of the connections that sniff hands over.
type chanListener struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newChanListener(a net.Addr) *chanListener {
	return &chanListener{addr: a, ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) push(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *chanListener) Addr() net.Addr { return l.addr }

// refuse answers a request that fasthttp's server refused before the
// handler ran (a head it cannot parse or that is too long, a body that
// breaks its framing, a timeout) with the gateway's error
// (Gateway.fail: x-lanes-error and a text body), and the status net/http's
// server, or the std path's handler, gives the same bytes. fasthttp closes
// the connection after it.
func (f *fastStack) refuse(ctx *fasthttp.RequestCtx, err error) {
	g := f.g
	status, code, msg := refusal(err)
	g.m.errors(code)
	g.fail((*fastOut)(ctx), false, status, code, msg)
}

// refusal is the status, x-lanes-error code and message of a request that
// fasthttp's server refused with err.
func refusal(err error) (status int, code, msg string) {
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.As(err, &small):
		return http.StatusRequestHeaderFieldsTooLarge, codeHeadTooLarge,
			fmt.Sprintf("lanes: the request head is over %d bytes", maxHeaderBytes)
	case errors.Is(err, fasthttp.ErrTimeout) || errors.As(err, &ne) && ne.Timeout():
		return http.StatusRequestTimeout, codeTimeout, "lanes: timed out reading the request"
	case headRefused(err):
		return http.StatusBadRequest, codeBadRequest, "lanes: malformed request"
	}
	return http.StatusBadRequest, codeBadBody, "lanes: reading the request body: " + err.Error()
}

// headRefused reports whether fasthttp's server refused a request's head
// with err, rather than its body: it wraps every error of a head it cannot
// parse as "error when reading request headers: ...", refuses a bad Host
// or target with ErrorInvalidURI, and an absolute-form target's scheme
// with "invalid scheme ...". The body's errors (a bad chunk size, a body
// shorter than its Content-Length) have no type to tell them by, and the
// server resets the request, head included, on any error.
func headRefused(err error) bool {
	m := err.Error()
	return errors.Is(err, fasthttp.ErrorInvalidURI) ||
		strings.HasPrefix(m, "error when reading request headers") || strings.HasPrefix(m, "invalid scheme")
}

// fastLogger sends fasthttp's messages to the gateway's logger.
type fastLogger struct{ log *slog.Logger }

func (l fastLogger) Printf(format string, args ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug("lanes gateway: fasthttp", "msg", fmt.Sprintf(format, args...))
	}
}

// shutdown closes the listeners and ends the idle connections; the others
// end once their requests are answered (drain).
func (f *fastStack) shutdown(context.Context) error {
	for _, s := range f.servers.all() {
		s.drain()
	}
	return nil
}

// close closes the listeners and the connections, and the connections to
// instances in use, which ends the attempts on them (a closed client
// connection does not end a read from an instance).
func (f *fastStack) close() error {
	for _, s := range f.servers.all() {
		s.stop()
	}
	f.up.Close()
	return nil
}

// release waits for the connection goroutines: after Shutdown, those of
// the connections that end once their answers are written (the gateway
// counts a request out when its handler returns, before fasthttp writes
// the answer), or until ctx ends; then, or after Close, it closes the
// connections left (hijacked since, say) and waits for them. It stops the
// sweeper of the upstream pools and closes their connections.
func (f *fastStack) release(ctx context.Context) {
	for _, s := range f.servers.all() {
		done := make(chan struct{})
		go func() { // ends with the connection goroutines, which stop ends
			s.wg.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
		}
		s.stop()
		<-done
	}
	f.up.Close()
}
