package gateway

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// benchBackend is a loopback server answering "ok" with its lane in a header.
func benchBackend(b *testing.B, ln string) string {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	body := []byte("ok\n")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h["X-Backend-Lane"] = []string{ln}
		h["Content-Type"] = []string{"text/plain"}
		w.Write(body)
	})}
	serveServer(b, l, srv)
	return l.Addr().String()
}

// serve serves h on a loopback port until the benchmark ends and returns
// its URL.
func serve(b *testing.B, h http.Handler) string {
	b.Helper()
	return "http://" + serveBackend(b, h)
}

// benchEngine is an engine with a baseline and an alice instance of orders.
func benchEngine(b *testing.B, baseAddr, aliceAddr string) *routing.Engine {
	b.Helper()
	e := routing.New()
	b.Cleanup(func() { e.Close() })
	var insts []registry.Instance
	for _, in := range []registry.Instance{
		{ID: "base", Service: "orders", Addr: baseAddr},
		{ID: "alice", Service: "orders", Addr: aliceAddr, Lane: "alice"},
	} {
		n, err := registry.Normalize(in)
		if err != nil {
			b.Fatal(err)
		}
		insts = append(insts, n)
	}
	e.SetInstances("orders", insts)
	return e
}

// plainProxy is the baseline of comparison: an httputil.ReverseProxy to one
// backend with the same transport settings, no lanes.
func plainProxy(target string, rt http.RoundTripper) *httputil.ReverseProxy {
	u := &url.URL{Scheme: "http", Host: target}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.SetXForwarded()
		},
		Transport:  rt,
		BufferPool: bufferPool{},
	}
}

var benchCases = []struct {
	name   string
	header http.Header
	want   string // the lane that must answer
}{
	{"request=baseline", http.Header{}, ""},
	{"request=lane", http.Header{"X-Lane": {"alice"}}, "alice"},
}

// serveGateway serves g with Gateway.Serve on a loopback port until the
// benchmark ends.
func serveGateway(b *testing.B, g *Gateway) string {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	serveServer(b, l, g)
	return "http://" + l.Addr().String()
}

// BenchmarkGateway sends requests through the gateway over loopback, one at a
// time, next to a plain httputil.ReverseProxy to the same backend: the
// gateway on net/http (proxy=lanes, ServeHTTP on an http.Server) and on its
// fast path (proxy=lanes-fast, Serve with Config.HTTP1 fast). The
// difference per request is the gateway's own cost (assignment, pick, lane
// headers) and its stack's; the rest is HTTP on loopback, twice.
func BenchmarkGateway(b *testing.B) {
	baseAddr, aliceAddr := benchBackend(b, ""), benchBackend(b, "alice")
	e := benchEngine(b, baseAddr, aliceAddr)
	g, err := New(Config{Engine: e, Routes: []Route{{Prefix: "/", Service: "orders"}}, HTTP1: HTTP1Std})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { g.Close() })
	fast, err := New(Config{Engine: e, Routes: []Route{{Prefix: "/", Service: "orders"}}, HTTP1: HTTP1Fast})
	if err != nil {
		b.Fatal(err)
	}
	h1, _ := newTransports(DefaultMaxIdleConnsPerHost, DefaultUpstreamIdleTimeout, 0, 0, nil)
	b.Cleanup(h1.CloseIdleConnections)

	proxies := []struct {
		name string
		url  string
	}{
		{"proxy=reverseproxy", serve(b, plainProxy(baseAddr, h1))},
		{"proxy=lanes", serve(b, g)},
		{"proxy=lanes-fast", serveGateway(b, fast)},
	}
	client := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64, DisableCompression: true}}
	b.Cleanup(client.CloseIdleConnections)
	for _, p := range proxies {
		for _, c := range benchCases {
			if p.name == "proxy=reverseproxy" && c.want != "" {
				continue
			}
			b.Run(p.name+"/"+c.name, func(b *testing.B) {
				req, _ := http.NewRequest(http.MethodGet, p.url+"/orders/1", nil)
				req.Header = c.header
				check := func() {
					resp, err := client.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 || resp.Header.Get("X-Backend-Lane") != c.want {
						b.Fatalf("status %d from lane %q, want 200 from %q", resp.StatusCode, resp.Header.Get("X-Backend-Lane"), c.want)
					}
				}
				check()
				b.ReportAllocs()
				for b.Loop() {
					check()
				}
			})
		}
	}
}

// BenchmarkGatewayParallel is BenchmarkGateway with concurrent clients.
func BenchmarkGatewayParallel(b *testing.B) {
	baseAddr, aliceAddr := benchBackend(b, ""), benchBackend(b, "alice")
	e := benchEngine(b, baseAddr, aliceAddr)
	g, err := New(Config{Engine: e, Routes: []Route{{Prefix: "/", Service: "orders"}}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { g.Close() })
	h1, _ := newTransports(DefaultMaxIdleConnsPerHost, DefaultUpstreamIdleTimeout, 0, 0, nil)
	b.Cleanup(h1.CloseIdleConnections)
	for _, p := range []struct{ name, url string }{
		{"proxy=reverseproxy", serve(b, plainProxy(baseAddr, h1))},
		{"proxy=lanes", serve(b, g)},
	} {
		b.Run(p.name, func(b *testing.B) {
			client := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64, DisableCompression: true}}
			defer client.CloseIdleConnections()
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := client.Get(p.url + "/orders/1")
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		})
	}
}

// cannedTransport answers every request at once, without a network, so that
// BenchmarkServeHTTP measures the proxy alone.
type cannedTransport struct{}

func (cannedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{
		StatusCode: 200, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"text/plain"}, "Content-Length": {"3"}},
		Body:          io.NopCloser(strings.NewReader("ok\n")),
		ContentLength: 3,
		Request:       req,
	}, nil
}

// discardWriter is a cheap http.ResponseWriter.
type discardWriter struct {
	h    http.Header
	code int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(code int)        { w.code = code }

// BenchmarkServeHTTP calls ServeHTTP in-process with a transport that answers
// at once: the gateway's work per request (route, lane, pick, rewrite,
// response headers) against a plain ReverseProxy's, allocations included.
func BenchmarkServeHTTP(b *testing.B) {
	e := benchEngine(b, "127.0.0.1:1", "127.0.0.1:2")
	g, err := New(Config{Engine: e, Routes: []Route{{Prefix: "/", Service: "orders"}}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { g.Close() })
	g.std.h1 = cannedTransport{}
	plain := plainProxy("127.0.0.1:1", cannedTransport{})
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	for _, p := range []struct {
		name string
		h    http.Handler
	}{{"proxy=reverseproxy", plain}, {"proxy=lanes", g}} {
		for _, c := range benchCases {
			if p.name == "proxy=reverseproxy" && c.want != "" {
				continue
			}
			b.Run(p.name+"/"+c.name, func(b *testing.B) {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://gw.example/orders/1", nil)
				req.RemoteAddr = "192.0.2.1:1234"
				req.Header = c.header
				w := &discardWriter{h: http.Header{}}
				b.ReportAllocs()
				for b.Loop() {
					clear(w.h)
					p.h.ServeHTTP(w, req)
					if w.code != 200 {
						b.Fatalf("status %d", w.code)
					}
				}
			})
		}
	}
	_ = time.Second
}

// cannedBackend is a loopback HTTP/1.1 server that answers every request
// with the same bytes, as fast as it reads them, allocating nothing per
// request: the upstream of the fast path's in-process benchmark and
// allocation test.
func cannedBackend(tb testing.TB, ln string) string {
	tb.Helper()
	answer := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Backend-Lane: " + ln + "\r\nContent-Length: 3\r\n\r\nok\n")
	// Registered before the accept loop's cleanup, this runs after it: the
	// connections end when their client closes them.
	var conns sync.WaitGroup
	tb.Cleanup(conns.Wait)
	return acceptLoop(tb, func(c net.Conn) {
		conns.Add(1)
		go func() {
			defer conns.Done()
			defer c.Close()
			br := bufio.NewReader(c)
			for {
				// Requests without bodies: the head ends with an empty line.
				for {
					line, err := br.ReadSlice('\n')
					if err != nil {
						return
					}
					if len(line) <= 2 {
						break
					}
				}
				if _, err := c.Write(answer); err != nil {
					return
				}
			}
		}()
	})
}

// benchReq is a request of the fast path's benchmark: a context, and the
// request as the server parsed it, which each run starts from (the fast
// path rewrites the request in place).
type benchReq struct {
	ctx  *fasthttp.RequestCtx
	orig *fasthttp.Request
}

// fastCtx is a fasthttp request for a GET of /orders/1 with header, from
// 192.0.2.1, as the fast path's server would hand it over.
func fastCtx(header http.Header) benchReq {
	req := new(fasthttp.Request)
	req.Header.SetMethod(http.MethodGet)
	req.Header.SetRequestURI("/orders/1")
	req.Header.SetHost("gw.example")
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	ctx := new(fasthttp.RequestCtx)
	ctx.Init(req, &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 1234}, nil)
	return benchReq{ctx: ctx, orig: req}
}

// fastGateway is a fast-path gateway routing orders to canned backends,
// configured by cfg (Engine and Routes are filled in).
func fastGateway(tb testing.TB, cfg Config) *Gateway {
	tb.Helper()
	reg := registry.NewMemory()
	tb.Cleanup(func() { reg.Close() })
	// dave is a known lane (an instance of another service), without an
	// instance of orders; bob exists nowhere.
	for _, in := range []registry.Instance{
		{ID: "base", Service: "orders", Addr: cannedBackend(tb, "")},
		{ID: "alice", Service: "orders", Addr: cannedBackend(tb, "alice"), Lane: "alice"},
		{ID: "p-dave", Service: "payments", Addr: "127.0.0.1:1", Lane: "dave"},
	} {
		if _, err := reg.Register(context.Background(), in, 0); err != nil {
			tb.Fatal(err)
		}
	}
	e := routing.New(routing.WithRegistry(reg), routing.WithRegistryLanes())
	tb.Cleanup(func() { e.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := e.Service("orders").WaitReady(ctx); err != nil {
		tb.Fatal(err)
	}
	for !e.KnownLane("dave") || !e.UnknownLane("bob") {
		if ctx.Err() != nil {
			tb.Fatal("the registry's lanes were not listed")
		}
		time.Sleep(time.Millisecond)
	}
	cfg.Engine, cfg.Routes = e, []Route{{Prefix: "/", Service: "orders"}}
	g, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { g.Close() })
	return g
}

// fastCases are the requests of the fast path's benchmark and allocation
// test: a lane request, and a baseline request with its request key, whose
// baggage member lane.Propagator builds (one allocation, on either stack; a
// request without a key gets a new one, which allocates too); and lane
// requests that fall back to the baseline, with their X-Lane-Fallback
// reason: a known lane without an instance of the service, and a lane that
// exists nowhere.
var fastCases = []struct {
	name   string
	header http.Header
	want   string
	allocs float64
}{
	{"request=baseline", http.Header{"X-Lanes-Key": {"user-1"}}, "", 1},
	{"request=lane", http.Header{"X-Lane": {"alice"}}, "alice", 0},
	{"request=baseline-newkey", http.Header{}, "", 2},
	{"request=no-instance-in-lane", http.Header{"X-Lane": {"dave"}}, "", 0},
	{"request=unknown-lane", http.Header{"X-Lane": {"bob"}}, "", 0},
}

// fallbackOf is the X-Lane-Fallback that the fast case named name gets.
func fallbackOf(name string) string {
	switch name {
	case "request=no-instance-in-lane":
		return "no_instance_in_lane"
	case "request=unknown-lane":
		return "unknown_lane"
	}
	return ""
}

// serveFastOnce runs one request through the fast path's handler and
// checks its answer.
func serveFastOnce(tb testing.TB, g *Gateway, r benchReq, want string) {
	ctx := r.ctx
	r.orig.CopyTo(&ctx.Request)
	ctx.Response.Reset()
	fastOf(g).handle(ctx)
	if ctx.Response.StatusCode() != 200 || string(ctx.Response.Header.Peek("X-Backend-Lane")) != want {
		tb.Fatalf("status %d from lane %q, want 200 from %q: %s", ctx.Response.StatusCode(), ctx.Response.Header.Peek("X-Backend-Lane"), want, ctx.Response.Body())
	}
}

// BenchmarkServeFast runs the fast path's handler in-process, over real
// keep-alive connections to canned loopback backends: the gateway's work
// per request on the fast path (route, lane, pick, outbound request, answer,
// lane headers) plus one loopback exchange, allocations included.
func BenchmarkServeFast(b *testing.B) {
	g := fastGateway(b, Config{})
	// The upstream write deadline's cost, side by side: a gateway without.
	off := fastGateway(b, Config{UpstreamWriteTimeout: -1})
	for _, c := range fastCases {
		run := func(name string, g *Gateway) {
			b.Run(name, func(b *testing.B) {
				ctx := fastCtx(c.header)
				serveFastOnce(b, g, ctx, c.want)
				b.ReportAllocs()
				for b.Loop() {
					serveFastOnce(b, g, ctx, c.want)
				}
			})
		}
		run(c.name, g)
		if c.want != "" {
			run(c.name+"/upstream-write-timeout=off", off)
		}
	}
}
