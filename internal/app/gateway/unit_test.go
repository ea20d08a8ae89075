package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/lanesdev/lanes/internal/lib/routedcall"
	"github.com/lanesdev/lanes/routing"
)

func TestNewValidation(t *testing.T) { onStacks(t, testNewValidation) }

func testNewValidation(t *testing.T) {
	e := routing.New()
	defer e.Close()
	ok := []Route{{Prefix: "/", Service: "orders"}}
	for _, c := range []struct {
		name string
		cfg  Config
		want string // in the error
	}{
		{"no engine", Config{Routes: ok}, "engine"},
		{"bad service", Config{Engine: e, Routes: []Route{{Prefix: "/", Service: "a b"}}}, `routes[0].service: invalid service "a b"`},
		{"empty service", Config{Engine: e, Routes: []Route{{Prefix: "/"}}}, `routes[0].service`},
		{"host with port", Config{Engine: e, Routes: []Route{{Host: "a.com:80", Service: "s"}}}, `routes[0].host: invalid host "a.com:80"`},
		{"host with scheme", Config{Engine: e, Routes: []Route{{Host: "http://a.com", Service: "s"}}}, `routes[0].host`},
		{"relative prefix", Config{Engine: e, Routes: []Route{{Prefix: "orders/", Service: "s"}}}, `routes[0].prefix: invalid path prefix "orders/"`},
		{"prefix with query", Config{Engine: e, Routes: []Route{{Prefix: "/a?b", Service: "s"}}}, `routes[0].prefix`},
		{"dot segment", Config{Engine: e, Routes: []Route{{Prefix: "/a/../b", Service: "s"}}}, `routes[0].prefix`},
		{"strip without prefix", Config{Engine: e, Routes: []Route{{Host: "a.com", StripPrefix: true, Service: "s"}}}, `routes[0].strip_prefix`},
		{"unreachable", Config{Engine: e, Routes: []Route{{Prefix: "/a/", Service: "s"}, {Prefix: "/a", Service: "t"}}}, `routes[1]: host "" and prefix "/a" are those of routes[0]`},
		{"bad domain", Config{Engine: e, Routes: ok, Domain: "lanes..localhost"}, `domain: invalid domain "lanes..localhost"`},
		{"bad alias", Config{Engine: e, Routes: ok, Aliases: []string{"a b"}}, `aliases[0]: invalid header name "a b"`},
		{"x-lane alias", Config{Engine: e, Routes: ok, Aliases: []string{"X-Lane"}}, `aliases[0]`},
		{"bad source", Config{Engine: e, Routes: ok, Disable: []Source{"canary"}}, `disable[0]: unknown source "canary"`},
		{"bad cookie", Config{Engine: e, Routes: ok, LaneCookie: "a;b"}, `lane_cookie: invalid cookie name "a;b"`},
		{"bad key header", Config{Engine: e, Routes: ok, KeyHeader: "a:b"}, `key_header`},
		{"bad proxy", Config{Engine: e, Routes: ok, TrustedProxies: []netip.Prefix{{}}}, `trusted_proxies[0]`},
		{"negative idle", Config{Engine: e, Routes: ok, MaxIdleConnsPerHost: -1}, `max_idle_conns_per_host`},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, err := New(c.cfg)
			if err == nil {
				g.Close()
				t.Fatalf("New accepted the config")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not contain %q", err, c.want)
			}
		})
	}
}

func TestClientAddr(t *testing.T) {
	g := &Gateway{trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}}
	for _, c := range []struct {
		peer    string
		xff     []string
		want    string
		trusted bool
	}{
		{"192.0.2.1:5", []string{"198.51.100.1"}, "192.0.2.1", false},
		{"10.0.0.1:5", nil, "10.0.0.1", true},
		{"10.0.0.1:5", []string{"198.51.100.1"}, "198.51.100.1", true},
		{"10.0.0.1:5", []string{"198.51.100.1, 203.0.113.9"}, "203.0.113.9", true},
		{"10.0.0.1:5", []string{"198.51.100.1", "203.0.113.9, 10.1.1.1"}, "203.0.113.9", true},
		{"10.0.0.1:5", []string{"10.2.2.2, 10.1.1.1"}, "10.2.2.2", true},
		{"10.0.0.1:5", []string{"198.51.100.1, garbage, 10.1.1.1"}, "10.1.1.1", true},
		{"10.0.0.1:5", []string{" , 203.0.113.9:443 ,"}, "203.0.113.9", true},
		{"10.0.0.1:5", []string{"[2001:db8::1]:443"}, "2001:db8::1", true},
		{"[::1]:5", []string{"::ffff:198.51.100.7"}, "198.51.100.7", true},
		{"[::ffff:10.0.0.1]:5", []string{"198.51.100.1"}, "198.51.100.1", true},
		{"pipe", []string{"198.51.100.1"}, "invalid IP", false},
	} {
		r := &http.Request{RemoteAddr: c.peer, Header: http.Header{}}
		for _, v := range c.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		got, trusted := g.clientAddr((*stdIn)(r))
		if got.String() != c.want || trusted != c.trusted {
			t.Errorf("peer %s, xff %q: got %s (trusted %v), want %s (trusted %v)", c.peer, c.xff, got, trusted, c.want, c.trusted)
		}
	}
}

func TestCookie(t *testing.T) {
	h := http.Header{"Cookie": {"a=1; lane=alice", `b="x"; lanes-key="k 1"`}}
	for name, want := range map[string]string{"a": "1", "lane": "alice", "b": "x", "lanes-key": "k 1"} {
		if got, ok := cookie(h["Cookie"], name); !ok || got != want {
			t.Errorf("cookie %s = %q, %v; want %q", name, got, ok, want)
		}
	}
	if _, ok := cookie(h["Cookie"], "Lane"); ok {
		t.Errorf("cookie names are case-sensitive")
	}
}

func TestHostOnly(t *testing.T) {
	for in, want := range map[string]string{"a.com": "a.com", "a.com:80": "a.com", "[::1]:80": "::1", "[::1]": "::1", "::1": "::1", "": ""} {
		if got := hostOnly(in); got != want {
			t.Errorf("hostOnly(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMetrics(t *testing.T) { onStacks(t, testMetrics) }

func testMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	w := newWorld(t, "canary:\n  - {service: orders, lane: canary, percent: 100}\n", Config{Registerer: reg})
	twoLanes(t, w)
	w.get(t, "/", nil) // no canary instance: baseline
	w.get(t, "/", map[string]string{"x-lane": "alice"})
	w.get(t, "/", map[string]string{"x-lane": "alice"})
	w.get(t, "/", map[string]string{"cookie": "lane=bob"})
	w.get(t, "/", map[string]string{"x-lane": "-"})
	can := newBackend(t, "canary-1", "canary")
	w.register(t, "orders", can.id, can.addr, "canary")
	w.get(t, "/", nil)

	want := map[string]float64{
		`lanes_gateway_requests_total{source="alias"}`:          0,
		`lanes_gateway_requests_total{source="baggage"}`:        0,
		`lanes_gateway_requests_total{source="baseline"}`:       1,
		`lanes_gateway_requests_total{source="canary"}`:         1,
		`lanes_gateway_requests_total{source="claims"}`:         0,
		`lanes_gateway_requests_total{source="cookie"}`:         1,
		`lanes_gateway_requests_total{source="header"}`:         2,
		`lanes_gateway_requests_total{source="host"}`:           0,
		`lanes_gateway_requests_total{source="policy-clients"}`: 0,
		`lanes_gateway_served_total{lane="alice"}`:              2,
		`lanes_gateway_served_total{lane="baseline"}`:           2,
		`lanes_gateway_served_total{lane="canary"}`:             1,
		`lanes_gateway_errors_total{code="invalid_lane"}`:       1,
	}
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			got[fmt.Sprintf("%s{%s}", mf.GetName(), strings.Join(labels, ","))] = m.GetCounter().GetValue()
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("metrics:\n got %v\nwant %v", got, want)
	}
	// A second gateway on the same registerer is refused.
	if _, err := New(Config{Engine: w.engine, Routes: []Route{{Prefix: "/", Service: "orders"}}, Registerer: reg}); err == nil || !strings.Contains(err.Error(), "already registered") {
		t.Errorf("second gateway on one registerer: %v", err)
	}
}

// TestCloseWaitsForRequests checks that Close cancels the requests in
// flight, waits for them, and that later requests are refused: a request
// whose instance has not answered, and one whose instance stalls in the
// middle of a small answer (which the fast path reads whole, from a
// connection that Close must close itself).
func TestCloseWaitsForRequests(t *testing.T) { onStacks(t, testCloseWaitsForRequests) }

func testCloseWaitsForRequests(t *testing.T) {
	for _, midAnswer := range []bool{false, true} {
		t.Run(fmt.Sprintf("mid-answer=%v", midAnswer), func(t *testing.T) { closeWaits(t, midAnswer) })
	}
}

func closeWaits(t *testing.T, midAnswer bool) {
	reg, e := routingWorld(t)
	entered := make(chan struct{})
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if midAnswer {
			w.Header().Set("Content-Length", "100")
			io.WriteString(w, "part")
			w.(http.Flusher).Flush()
		}
		close(entered)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer slow.Close()
	defer close(release)
	registerAddr(t, reg, e, "orders", "slow", strings.TrimPrefix(slow.URL, "http://"))

	g, err := New(Config{Engine: e, Routes: []Route{{Prefix: "/", Service: "orders"}}, HTTP1: stackOf(t)})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- g.Serve(l) }()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	got := make(chan error, 1)
	go func() {
		resp, err := (&http.Client{Transport: tr}).Get("http://" + l.Addr().String() + "/")
		if err == nil {
			resp.Body.Close()
		}
		got <- err
	}()
	<-entered
	closed := make(chan error, 1)
	go func() { closed <- g.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(waitFor):
		t.Fatal("Close did not return")
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve: %v", err)
	}
	<-got // the client's connection was closed under it
	// After Close: refused, whatever server calls the handler.
	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("X-Lanes-Error") != "closed" {
		t.Errorf("after Close: %d %q", rec.Code, rec.Header().Get("X-Lanes-Error"))
	}
	if err := g.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve after Close: %v", err)
	}
}

func TestShutdown(t *testing.T) { onStacks(t, testShutdown) }

func testShutdown(t *testing.T) {
	reg, e := routingWorld(t)
	b := newBackend(t, "base", "")
	registerAddr(t, reg, e, "orders", b.id, b.addr)
	g, err := New(Config{Engine: e, Routes: []Route{{Prefix: "/", Service: "orders"}}, HTTP1: stackOf(t)})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- g.Serve(l) }()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://" + l.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := g.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve: %v", err)
	}
}

func TestNotReady(t *testing.T) { onStacks(t, testNotReady) }

func testNotReady(t *testing.T) {
	// A store whose watch never delivers: the engine never has a policy.
	e := routing.New(routing.WithPolicyStore(stuckStore{}))
	defer e.Close()
	g, err := New(Config{Engine: e, Routes: []Route{{Prefix: "/", Service: "orders"}}, ReadyTimeout: 50 * time.Millisecond, HTTP1: stackOf(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("X-Lanes-Error") != "not_ready" {
		t.Errorf("got %d %q, want 503 not_ready", rec.Code, rec.Header().Get("X-Lanes-Error"))
	}
}

// TestValidate checks that Config.Validate refuses what New refuses, without
// an engine, and says which route shadows one that can never match.
func TestValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("the zero Config: %v", err)
	}
	for _, c := range []struct {
		cfg          Config
		field, part  string
		index, other int
	}{
		{Config{Routes: []Route{{Prefix: "/", Service: "web"}, {Prefix: "/", Service: "web"}}}, "routes", "", 1, 0},
		{Config{Routes: []Route{{Prefix: "/a", Service: "web"}, {Prefix: "/b", Service: "web"}, {Prefix: "/a/", Service: "web"}}}, "routes", "", 2, 0},
		{Config{Routes: []Route{{Prefix: "/%zz", Service: "web"}}}, "routes", "prefix", 0, -1},
		{Config{Disable: []Source{SourceCookie, "headers"}}, "disable", "", 1, -1},
		{Config{MaxConns: -1}, "max_conns", "", -1, -1},
		{Config{MaxIdleConnsPerHost: -1}, "max_idle_conns_per_host", "", -1, -1},
		{Config{HTTP1: "loop"}, "http1", "", -1, -1},
	} {
		err := c.cfg.Validate()
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || ce.Part != c.part || ce.Index != c.index || ce.Shadowed != c.other {
			t.Errorf("%+v: %#v, want field %s[%d].%s shadowed by %d", c.cfg, err, c.field, c.index, c.part, c.other)
		}
	}
}

// TestProvision: every timeout of a Config, and Retries, reads its field
// one way: 0 is the default, a negative value none (0), any other as set.
func TestProvision(t *testing.T) {
	timeouts := []struct {
		name string
		set  func(*Config, time.Duration)
		get  func(settings) time.Duration
		def  time.Duration
	}{
		{"ready", func(c *Config, d time.Duration) { c.ReadyTimeout = d }, func(s settings) time.Duration { return s.readyWait }, DefaultReadyTimeout},
		{"response header", func(c *Config, d time.Duration) { c.ResponseHeaderTimeout = d }, func(s settings) time.Duration { return s.headerTimeout }, routedcall.DefaultResponseHeaderTimeout},
		{"upstream write", func(c *Config, d time.Duration) { c.UpstreamWriteTimeout = d }, func(s settings) time.Duration { return s.writeTimeout }, DefaultUpstreamWriteTimeout},
		{"upstream read", func(c *Config, d time.Duration) { c.UpstreamReadTimeout = d }, func(s settings) time.Duration { return s.readTimeout }, DefaultUpstreamReadTimeout},
		{"client write", func(c *Config, d time.Duration) { c.ClientWriteTimeout = d }, func(s settings) time.Duration { return s.clientWrite }, DefaultClientWriteTimeout},
		{"client read", func(c *Config, d time.Duration) { c.ClientReadTimeout = d }, func(s settings) time.Duration { return s.clientRead }, DefaultClientReadTimeout},
		{"upstream idle", func(c *Config, d time.Duration) { c.UpstreamIdleTimeout = d }, func(s settings) time.Duration { return s.upIdle }, DefaultUpstreamIdleTimeout},
		{"client idle", func(c *Config, d time.Duration) { c.ClientIdleTimeout = d }, func(s settings) time.Duration { return s.clientIdle }, DefaultClientIdleTimeout},
		{"client header", func(c *Config, d time.Duration) { c.ClientHeaderTimeout = d }, func(s settings) time.Duration { return s.clientHeader }, DefaultClientHeaderTimeout},
	}
	for _, to := range timeouts {
		for _, c := range []struct{ set, want time.Duration }{{0, to.def}, {-1, 0}, {-time.Hour, 0}, {3, 3}} {
			var cfg Config
			to.set(&cfg, c.set)
			if err := cfg.Validate(); err != nil {
				t.Errorf("%s %d: %v", to.name, c.set, err)
			}
			if got := to.get(provision(cfg)); got != c.want {
				t.Errorf("%s %d: %d, want %d", to.name, c.set, got, c.want)
			}
		}
	}
	// The routed call reads Retries and the response-header timeout as
	// the gateway's settings do (routedcall.Config): they pass through.
	for _, n := range []int{0, -1, 3} {
		cfg := Config{Retries: n, ResponseHeaderTimeout: time.Duration(n)}
		if got := provision(cfg).call; got.Retries != n || got.ResponseHeaderTimeout != time.Duration(n) {
			t.Errorf("Retries and ResponseHeaderTimeout %d: the routed call gets %d and %d", n, got.Retries, got.ResponseHeaderTimeout)
		}
	}
}

// TestNoTimeouts: a gateway whose every timeout is off (negative) serves,
// on both stacks.
func TestNoTimeouts(t *testing.T) { onStacks(t, testNoTimeouts) }

func testNoTimeouts(t *testing.T) {
	w := newWorld(t, "", Config{ReadyTimeout: -1, ResponseHeaderTimeout: -1, UpstreamWriteTimeout: -1, UpstreamReadTimeout: -1,
		ClientWriteTimeout: -1, ClientReadTimeout: -1, UpstreamIdleTimeout: -1, ClientIdleTimeout: -1, ClientHeaderTimeout: -1, Retries: -1})
	b := newBackend(t, "one", "")
	w.register(t, "orders", b.id, b.addr, "")
	for range 3 {
		expectServed(t, w.get(t, "/", nil), b.id, "")
	}
	r := do(t, w.client, http.MethodPost, w.url+"/", nil)
	if r.status != http.StatusOK {
		t.Errorf("POST: %d", r.status)
	}
}

// TestFastPathAllocs: the fast path's work per request, from the parsed
// request to the answer ready to write (route, lane, pick, outbound
// request, upstream exchange, lane headers), allocates nothing of its own:
// a lane request nothing at all, a baseline request only the baggage member
// of its request key.
func TestFastPathAllocs(t *testing.T) { onStacks(t, testFastPathAllocs) }

func testFastPathAllocs(t *testing.T) {
	if testing.CoverMode() != "" || raceEnabled {
		t.Skip("allocations are not measured under -cover or -race")
	}
	g := fastGateway(t, Config{})
	for _, c := range fastCases {
		ctx := fastCtx(c.header)
		serveFastOnce(t, g, ctx, c.want)
		if got := string(ctx.ctx.Response.Header.Peek(hLaneFallback)); got != fallbackOf(c.name) {
			t.Errorf("%s: X-Lane-Fallback %q, want %q", c.name, got, fallbackOf(c.name))
		}
		if n := testing.AllocsPerRun(200, func() { serveFastOnce(t, g, ctx, c.want) }); n > c.allocs {
			t.Errorf("%s: %.1f allocations per request, want %.0f", c.name, n, c.allocs)
		}
	}
}

// FuzzFastTarget: the fast path reads a request target as net/http does.
// When it serves the target itself, its path is net/http's URL.Path, and
// the target it sends upstream after removing a route's prefix names the
// path that net/http's stripURL leaves, with the same query.
func FuzzFastTarget(f *testing.F) {
	for _, s := range []string{"/", "/orders/1?x=1", "/api/v1", "/api", "/api/%2e%2e/x", "/a%2Fb?q", "/%zz", "*", "http://h/p", "/api?", "//api/x", "/api%2F"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, target string) {
		ctx := new(fasthttp.RequestCtx)
		var req fasthttp.Request
		req.Header.SetRequestURI(target)
		ctx.Init(&req, nil, nil)
		target = string(req.Header.RequestURI()) // as the server holds it
		var h fasthttp.RequestHeader
		h.SetRequestURI(target)
		path, how := classify(ctx)
		if how == fastBad {
			if _, err := url.ParseRequestURI(target); err == nil && strings.HasPrefix(target, "/") {
				t.Fatalf("%q: the fast path refuses it, net/http takes it", target)
			}
			return
		}
		if how == fastStd {
			return
		}
		u, err := url.ParseRequestURI(target)
		if err != nil {
			t.Fatalf("%q: the fast path serves it, net/http refuses it: %v", target, err)
		}
		if path != u.Path {
			t.Fatalf("%q: fast path %q, net/http %q", target, path, u.Path)
		}
		const prefix = "/api"
		if !matchPath(u.Path, prefix) {
			return
		}
		stripTarget(&h, prefix)
		got, err := url.ParseRequestURI(string(h.RequestURI()))
		if err != nil {
			t.Fatalf("%q: stripped to %q, which does not parse: %v", target, h.RequestURI(), err)
		}
		want := *u
		stripURL(&want, prefix)
		if got.Path != want.Path || got.RawQuery != want.RawQuery {
			t.Fatalf("%q: stripped to path %q query %q, want %q %q", target, got.Path, got.RawQuery, want.Path, want.RawQuery)
		}
	})
}

// TestRefusal: the fast path's server refusals get the statuses net/http
// gives the same bytes, and the gateway's error codes.
func TestRefusal(t *testing.T) { onStacks(t, testRefusal) }

func testRefusal(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		code   string
	}{
		{&fasthttp.ErrSmallBuffer{}, 431, codeHeadTooLarge},
		{&net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, 408, codeTimeout},
		{io.ErrUnexpectedEOF, 400, codeBadBody},
		{errors.New("empty hex number"), 400, codeBadBody},
		{fasthttp.ErrorInvalidURI, 400, codeBadRequest},
		{fmt.Errorf("error when reading request headers: %w", io.ErrUnexpectedEOF), 400, codeBadRequest},
		{fmt.Errorf("error when reading request headers: %w", errors.New("cannot find http request method")), 400, codeBadRequest},
	} {
		status, code, msg := refusal(tc.err)
		if status != tc.status || code != tc.code || !strings.HasPrefix(msg, "lanes: ") {
			t.Errorf("refusal(%v) = %d %s %q, want %d %s", tc.err, status, code, msg, tc.status, tc.code)
		}
	}
}
