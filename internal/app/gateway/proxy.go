package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/routing"
)

// Canonical keys of the headers the gateway writes.
const (
	hLane       = "X-Lane"
	hLaneServed = "X-Lane-Served"
	hError      = "X-Lanes-Error"
	hBaggage    = "Baggage"
	hXFF        = "X-Forwarded-For"
	hXFHost     = "X-Forwarded-Host"
	hXFProto    = "X-Forwarded-Proto"
	hRealIP     = "X-Real-Ip"
)

// Error codes of the x-lanes-error header, besides the routing codes.
const (
	codeInvalidLane = "invalid_lane"
	codeNoRoute     = "no_route"
	codeUpstream    = "upstream"
	codeClosed      = "closed"
	codeNotReady    = "not_ready"
)

// reqState is what the proxy hooks need to know about one request. It is
// pooled, and reaches the hooks through the request's context.
type reqState struct {
	g       *Gateway
	w       http.ResponseWriter
	route   *route
	req     routing.Request
	res     routing.Result
	grpc    bool
	client  netip.Addr // the client address (see Gateway.clientAddr)
	trusted bool       // the direct peer is a trusted proxy
	hdr     headerView // what the lane propagator reads
	retried bool
	// reported is set once the outcome of res has been reported.
	reported bool
}

type stateKey struct{}

func stateOf(ctx context.Context) *reqState {
	st, _ := ctx.Value(stateKey{}).(*reqState)
	return st
}

// report feeds the outcome of the current pick to outlier detection, once.
func (st *reqState) report(ok bool) {
	if st.reported {
		return
	}
	st.reported = true
	st.res.Report(ok)
}

// ServeHTTP routes one request: it finds the route, assigns the lane, picks
// an instance through the engine and proxies the request to it.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	grpc := isGRPC(r)
	if !g.enter() {
		g.fail(w, grpc, http.StatusServiceUnavailable, codeClosed, "lanes: the gateway is closing")
		return
	}
	defer g.exit()

	// The route, on the host without its lane label.
	host := hostOnly(r.Host)
	label, rest, laneHost := g.splitLaneHost(host)
	matchHost := host
	if laneHost {
		matchHost = rest
	}
	rt := g.match(matchHost, r.URL.Path)
	if rt == nil {
		g.m.errors(codeNoRoute)
		g.fail(w, grpc, http.StatusNotFound, codeNoRoute, fmt.Sprintf("lanes: no route for host %q and path %q", host, r.URL.Path))
		return
	}
	if !g.ready(r.Context(), rt.svc) {
		g.m.errors(codeNotReady)
		g.fail(w, grpc, http.StatusServiceUnavailable, codeNotReady, fmt.Sprintf("lanes: service %q: the routing engine is not ready", rt.Service))
		return
	}

	// The lane.
	st := g.pool.Get().(*reqState)
	defer g.release(st)
	st.g, st.w, st.route, st.grpc = g, w, rt, grpc
	l, source, bad := g.assign(r, st, label, laneHost)
	if bad != nil {
		g.m.errors(codeInvalidLane)
		g.fail(w, grpc, http.StatusBadRequest, codeInvalidLane,
			fmt.Sprintf("lanes: invalid lane %q from %s: breaks the rule %q: %s", bad.value, bad.source, bad.rule, ruleText(bad.rule)))
		return
	}
	st.req = routing.Request{Lane: l, Zone: g.zone}
	if l == "" {
		st.req.Key = g.key(r)
	}

	// The pick.
	res, err := rt.svc.Pick(st.req)
	if err != nil {
		var re *routing.Error
		if errors.As(err, &re) {
			if l != "" {
				w.Header()[hLane] = g.lanes.get(l).lane
			}
			g.m.errors(string(re.Code))
			g.fail(w, grpc, http.StatusServiceUnavailable, string(re.Code), "lanes: "+re.Error())
			return
		}
		g.fail(w, grpc, http.StatusInternalServerError, "internal", "lanes: "+err.Error())
		return
	}
	st.res = res
	if l == "" && res.RequestLane != "" {
		source = srcCanary
	}
	g.m.source(source)
	g.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), stateKey{}, st)))
}

func (g *Gateway) release(st *reqState) {
	*st = reqState{}
	g.pool.Put(st)
}

var baselineServed = []string{"baseline"}[:1:1]

// servedValue is the x-lane-served value of serving lane l.
func (g *Gateway) servedValue(l string) []string {
	if l == "" {
		return baselineServed
	}
	return g.lanes.get(l).lane
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
	t := time.NewTimer(g.readyWait)
	defer t.Stop()
	for _, ch := range []<-chan struct{}{pr, sr} {
		select {
		case <-ch:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// key returns the request key of canary splits.
func (g *Gateway) key(r *http.Request) string {
	if v := r.Header[g.keyHeader]; len(v) > 0 && v[0] != "" {
		return v[0]
	}
	if v, ok := cookie(r.Header, g.keyCookie); ok {
		return v
	}
	return ""
}

// rewrite builds the outbound request: the instance's URL, the path without
// a stripped prefix, the forwarding headers and the lane headers.
func (g *Gateway) rewrite(pr *httputil.ProxyRequest) {
	st := stateOf(pr.In.Context())
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = st.res.Instance.Addr
	if st.route.StripPrefix {
		stripURL(out.URL, st.route.prefix)
	}
	if g.preserve {
		out.Host = pr.In.Host
	} else {
		out.Host = ""
	}

	// Lane headers: nothing the client sent, only what the gateway decided.
	g.stripLaneHeaders(out.Header)
	g.forward(pr, st)
	l := st.res.RequestLane
	if l != "" && len(out.Header[hBaggage]) == 0 {
		v := g.lanes.get(l) // the common case, without allocating
		out.Header[hLane] = v.lane
		out.Header[hBaggage] = v.baggage
		return
	}
	g.prop.InjectLane(l, lane.HTTPHeader(out.Header))
}

// laneHeaders sets the response headers x-lane and x-lane-served of a
// proxied request on w. They are set once the instance has answered (or
// failed), as the proxy clears the header map after a 1xx response.
func (g *Gateway) laneHeaders(st *reqState) {
	h := st.w.Header()
	if l := st.res.RequestLane; l != "" {
		h[hLane] = g.lanes.get(l).lane
	}
	h[hLaneServed] = g.servedValue(st.res.Lane)
}

// modifyResponse reports the outcome and settles the lane headers of the
// response.
func (g *Gateway) modifyResponse(resp *http.Response) error {
	st := stateOf(resp.Request.Context())
	h := resp.Header
	delete(h, hLane) // the gateway's own go on the ResponseWriter
	delete(h, hLaneServed)
	g.laneHeaders(st)
	g.m.served(st.res.Lane)
	// A 5xx with x-lanes-error is a routing failure further downstream,
	// answered by a healthy instance (as laneshttp classifies it).
	if resp.StatusCode >= 500 {
		st.report(len(h[hError]) > 0)
		return nil
	}
	if !st.grpc {
		st.report(true)
		return nil
	}
	if s, ok := h["Grpc-Status"]; ok { // trailers-only
		st.report(len(s) == 0 || s[0] != grpcUnavailable)
		return nil
	}
	resp.Body = &grpcBody{ReadCloser: resp.Body, resp: resp, st: st}
	return nil
}

const grpcUnavailable = "14"

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
		b.st.report(b.resp.Trailer.Get("Grpc-Status") != grpcUnavailable)
	case err != nil && b.resp.Request.Context().Err() == nil:
		b.st.report(false)
	}
	return n, err
}

func (b *grpcBody) Close() error {
	if b.resp.Request.Context().Err() == nil {
		b.st.report(b.resp.Trailer.Get("Grpc-Status") != grpcUnavailable)
	}
	return b.ReadCloser.Close()
}

// proxyError answers a call that got no response from the instance.
func (g *Gateway) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	st := stateOf(r.Context())
	g.laneHeaders(st)
	if r.Context().Err() != nil {
		// The client went away: that says nothing about the instance.
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	st.report(false)
	g.m.errors(codeUpstream)
	inst := st.res.Instance
	g.log.Warn("lanes gateway: upstream call failed", "service", st.route.Service, "instance", inst.ID, "addr", inst.Addr,
		"lane", st.res.RequestLane, "retried", st.retried, "err", err)
	msg := fmt.Sprintf("lanes: service %q, instance %q: %v", st.route.Service, inst.ID, err)
	g.fail(w, st.grpc, http.StatusBadGateway, codeUpstream, msg)
}

// upstream sends outbound requests: gRPC over h2c, the rest over HTTP/1.1
// with keep-alive. It retries an idempotent request without a body once on
// another instance when the first attempt got no response.
type upstream struct{ g *Gateway }

func (u *upstream) RoundTrip(req *http.Request) (*http.Response, error) {
	st := stateOf(req.Context())
	rt := u.g.h1
	if st != nil && st.grpc {
		rt = u.g.h2c
	}
	resp, err := rt.RoundTrip(req)
	if err == nil || st == nil || st.retried || !retryable(req) || req.Context().Err() != nil {
		return resp, err
	}
	failed := st.res
	st.report(false)
	for range 4 {
		res, perr := st.route.svc.Pick(routing.Request{Lane: failed.RequestLane, Zone: st.req.Zone, Key: st.req.Key})
		if perr != nil {
			break
		}
		if res.Instance.ID == failed.Instance.ID {
			continue // not a probe: the failed instance is not half-open
		}
		u.g.log.Debug("lanes gateway: retrying on another instance", "service", st.route.Service,
			"failed", failed.Instance.ID, "next", res.Instance.ID, "err", err)
		st.res, st.reported, st.retried = res, false, true
		r2 := new(http.Request)
		*r2 = *req
		u2 := new(url.URL)
		*u2 = *req.URL
		u2.Host = res.Instance.Addr
		r2.URL = u2
		return rt.RoundTrip(r2)
	}
	return resp, err
}

// retryable reports whether req may be sent again: it has no body, and an
// idempotent method or an Idempotency-Key header (as http.Transport judges).
func retryable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody {
		return false
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	if _, ok := req.Header["Idempotency-Key"]; ok {
		return true
	}
	_, ok := req.Header["X-Idempotency-Key"]
	return ok
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

// fail writes an error of the gateway: text with x-lanes-error, or for a
// gRPC call a trailers-only gRPC status.
func (g *Gateway) fail(w http.ResponseWriter, grpc bool, status int, code, msg string) {
	h := w.Header()
	h[hError] = []string{code}
	if grpc {
		h["Content-Type"] = []string{"application/grpc"}
		h["Grpc-Status"] = []string{grpcCode(status)}
		h["Grpc-Message"] = []string{grpcEscape(msg)}
		w.WriteHeader(http.StatusOK)
		return
	}
	h["Content-Type"] = []string{"text/plain; charset=utf-8"}
	h["X-Content-Type-Options"] = []string{"nosniff"}
	w.WriteHeader(status)
	io.WriteString(w, msg+"\n")
}

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
