package laneshttp_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

const routingPolicy = `
lanes:
  bob: {fallback: [team-a]}
  dave: {strict: true}
`

// TestRouteByLane covers the lane chain over HTTP: baseline, own lane,
// fallback, unknown lane, strict lane, and isolation of baseline requests.
func TestRouteByLane(t *testing.T) {
	f := newFleet(t, routingPolicy)
	backends := map[string]*backend{}
	for _, spec := range []string{"base orders", "alice orders lane=alice", "team-a orders lane=team-a", "pay-alice payments lane=alice"} {
		b := f.start(spec)
		backends[b.id] = b
	}
	f.await("orders", 3)
	f.await("payments", 1)
	c := f.client()

	for _, tc := range []struct {
		name, lane, url string
		want            string // the backend that serves, or the routing error code
		reason          string
	}{
		{"baseline", "", "http://orders/x", "base", ""},
		{"lane", "alice", "http://orders/x", "alice", ""},
		{"fallback", "bob", "http://orders/x", "team-a", ""},
		{"unknown lane", "carol", "http://orders/x", "base", ""},
		{"strict lane without instance", "dave", "http://orders/x", string(routing.CodeLaneUnavailable), ""},
		{"isolation: baseline never reaches a lane instance", "", "http://payments/x", string(routing.CodeNoInstance), ""},
		{"lane only service", "alice", "http://payments/x", "pay-alice", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := lane.WithLane(bg(t), tc.lane)
			for range 4 { // every pick, not just the first
				code, body, _, err := call(ctx, c, http.MethodGet, tc.url, nil)
				var re *routing.Error
				if errors.As(err, &re) {
					if string(re.Code) != tc.want || re.Lane != tc.lane || re.Service != strings.TrimPrefix(strings.TrimSuffix(tc.url, "/x"), "http://") {
						t.Fatalf("routing error %+v, want code %s for lane %q", re, tc.want, tc.lane)
					}
					continue
				}
				if err != nil || code != 200 || body != tc.want {
					t.Fatalf("got %d %q %v, want 200 from %s", code, body, err, tc.want)
				}
				r, _ := backends[body].lastRequest()
				if got := r.Header.Get("X-Lane"); got != tc.lane {
					t.Fatalf("%s received x-lane %q, want the request lane %q", body, got, tc.lane)
				}
				if r.Host != strings.TrimPrefix(strings.TrimSuffix(tc.url, "/x"), "http://") {
					t.Fatalf("Host %q, want the service name", r.Host)
				}
			}
		})
	}
}

// TestStaleLaneHeadersRemovedForBaseline: a baseline request carries no lane
// downstream, whatever headers the caller copied into it; other baggage
// members pass.
func TestStaleLaneHeadersRemovedForBaseline(t *testing.T) {
	f := newFleet(t, "")
	base := f.start("base orders")
	f.start("bob orders lane=bob")
	f.await("orders", 2)
	c := f.client(laneshttp.WithPropagator(lane.Propagator{Aliases: []string{"service-lane"}}))

	req, _ := http.NewRequestWithContext(bg(t), http.MethodGet, "http://orders/", nil)
	req.Header.Set("X-Lane", "bob")
	req.Header.Set("Service-Lane", "bob")
	req.Header.Set("Baggage", "team=x, lane=bob;p=1")
	req.Header["x-lane"] = []string{"bob"} // not canonical: would go out as a second header
	req.Header.Set("X-Other", "kept")
	for range 4 {
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if string(body) != "base" {
			t.Fatalf("a baseline request with stale lane headers reached %q", body)
		}
	}
	r, _ := base.lastRequest()
	if v := r.Header.Values("X-Lane"); v != nil {
		t.Errorf("x-lane %q reached the baseline", v)
	}
	if v := r.Header.Values("Service-Lane"); v != nil {
		t.Errorf("alias %q reached the baseline", v)
	}
	if v := r.Header.Values("Baggage"); !slices.Equal(v, []string{"team=x"}) {
		t.Errorf("baggage %q, want team=x alone", v)
	}
	if r.Header.Get("X-Other") != "kept" {
		t.Errorf("other headers must pass")
	}
}

// TestLaneRequestOverridesHeaders: the lane comes from the context; lane
// headers the caller set by hand are replaced, in every spelling.
func TestLaneRequestOverridesHeaders(t *testing.T) {
	f := newFleet(t, "")
	alice := f.start("alice orders lane=alice")
	f.start("base orders")
	f.await("orders", 2)
	c := f.client()
	code, body := get(t, lane.WithLane(bg(t), "alice"), c, "http://orders/", "x-lane", "bob", "Baggage", "lane=bob,team=x")
	if code != 200 || body != "alice" {
		t.Fatalf("got %d %q", code, body)
	}
	r, _ := alice.lastRequest()
	if v := r.Header.Values("X-Lane"); !slices.Equal(v, []string{"alice"}) {
		t.Errorf("x-lane %q", v)
	}
	if v := r.Header.Values("Baggage"); !slices.Equal(v, []string{"lane=alice,team=x"}) {
		t.Errorf("baggage %q", v)
	}
}

// TestCanaryLaneTravelsDownstream: a canary split at the first hop picks a
// lane, which the next hop routes by.
func TestCanaryLaneTravelsDownstream(t *testing.T) {
	f := newFleet(t, "canary:\n  - {service: orders, lane: canary, percent: 100}\n")
	down := f.client()
	// orders: its handler calls payments with the request's context.
	relay := func(in registry.Instance, _ http.Handler) http.Handler {
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, body, _, err := call(r.Context(), down, http.MethodGet, "http://payments/", nil)
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			io.WriteString(w, in.ID+">"+body+" lane="+lane.FromContext(r.Context()))
		})
		return laneshttp.Handler(h, laneshttp.WithLogger(quiet))
	}
	f.start("orders-base orders", relay)
	f.start("orders-canary orders lane=canary", relay)
	f.start("pay-base payments")
	pc := f.start("pay-canary payments lane=canary")
	f.await("orders", 2)
	f.await("payments", 2)

	code, body := get(t, bg(t), f.client(), "http://orders/")
	if code != 200 || body != "orders-canary>pay-canary lane=canary" {
		t.Fatalf("got %d %q, want the canary lane at both hops", code, body)
	}
	if r, _ := pc.lastRequest(); r.Header.Get("X-Lane") != "canary" {
		t.Fatalf("payments got x-lane %q", r.Header.Get("X-Lane"))
	}
}

// TestRoundTripDoesNotModifyRequest: the http.RoundTripper contract.
func TestRoundTripDoesNotModifyRequest(t *testing.T) {
	f := newFleet(t, "")
	base := f.start("base orders")
	f.start("alice orders lane=alice")
	f.await("orders", 2)
	tr := f.client().Transport
	for _, l := range []string{"", "alice"} {
		req, _ := http.NewRequestWithContext(lane.WithLane(bg(t), l), http.MethodPut, "http://orders:8080/p?q=1", strings.NewReader("payload"))
		req.Header.Set("X-Lane", "stale")
		req.Header.Set("Baggage", "lane=stale,team=x")
		req.Header.Set("X-Custom", "v")
		wantURL, wantHost, wantHeader := req.URL.String(), req.Host, cloneHeader(req.Header)
		urlPtr := req.URL
		res, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if req.URL != urlPtr || req.URL.String() != wantURL || req.Host != wantHost || !maps.EqualFunc(req.Header, wantHeader, slices.Equal) {
			t.Fatalf("lane %q: the caller's request changed: %s %q %v", l, req.URL, req.Host, req.Header)
		}
		if l == "" {
			r, body := base.lastRequest()
			if r.Host != "orders:8080" || r.URL.RequestURI() != "/p?q=1" || body != "payload" {
				t.Fatalf("sent Host %q, URI %q, body %q", r.Host, r.URL.RequestURI(), body)
			}
		}
	}
}

func cloneHeader(h http.Header) http.Header {
	c := http.Header{}
	for k, v := range h {
		c[k] = slices.Clone(v)
	}
	return c
}

// TestRoutingErrorFromRoundTrip: a routing failure is an error that wraps
// the *routing.Error, and the request body is closed.
func TestRoutingErrorFromRoundTrip(t *testing.T) {
	f := newFleet(t, routingPolicy)
	f.start("base orders")
	f.await("orders", 1)
	tr := f.client().Transport
	body := &closeRecorder{Reader: strings.NewReader("x")}
	req, _ := http.NewRequestWithContext(lane.WithLane(bg(t), "dave"), http.MethodPost, "http://orders/", body)
	res, err := tr.RoundTrip(req)
	if res != nil {
		t.Fatal("a response with an error")
	}
	var re *routing.Error
	if !errors.As(err, &re) || re.Code != routing.CodeLaneUnavailable || re.Service != "orders" || re.Lane != "dave" {
		t.Fatalf("error %v does not wrap the routing error", err)
	}
	if !errors.Is(err, &routing.Error{Code: routing.CodeLaneUnavailable}) {
		t.Fatal("errors.Is by code")
	}
	if !body.closed {
		t.Fatal("the request body was not closed")
	}
}

type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

// TestWriteError: the 503 a proxy answers for a routing failure.
func TestWriteError(t *testing.T) {
	w := httptestRecorder()
	err := &url.Error{Op: "Get", URL: "http://orders/", Err: &routing.Error{Code: routing.CodeNoInstance, Service: "orders", Lane: "alice"}}
	if !laneshttp.WriteError(w, err) {
		t.Fatal("not written")
	}
	if w.Code != 503 || w.Header().Get("X-Lanes-Error") != "no_instance" || !strings.Contains(w.Body.String(), `"orders"`) || !strings.Contains(w.Body.String(), `"alice"`) {
		t.Fatalf("got %d %v %q", w.Code, w.Header(), w.Body)
	}
	if laneshttp.WriteError(httptestRecorder(), errors.New("other")) {
		t.Fatal("wrote an answer for another error")
	}
}

// TestReverseProxy: the style of httputil.ReverseProxy: the inbound request
// (whose lane the middleware reads) and the outbound one (which the Rewrite
// hook addresses to a service, and the lanes Transport routes and writes the
// lane into) are kept apart. Routing failures become 503s.
func TestReverseProxy(t *testing.T) {
	f := newFleet(t, routingPolicy)
	alice := f.start("alice orders lane=alice")
	base := f.start("base orders")
	f.await("orders", 2)
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(&url.URL{Scheme: "http", Host: "orders"})
		},
		Transport:    f.client().Transport,
		ErrorHandler: laneshttp.ProxyErrorHandler,
	}
	gw := httptestServer(t, laneshttp.Handler(proxy, laneshttp.WithLogger(quiet)))
	pc := plainClient(t)

	if code, body := get(t, bg(t), pc, gw.URL+"/a", "X-Lane", "Alice"); code != 200 || body != "alice" {
		t.Fatalf("lane: %d %q", code, body)
	}
	if r, _ := alice.lastRequest(); r.Header.Get("X-Lane") != "alice" || r.URL.Path != "/a" {
		t.Fatalf("alice got x-lane %q path %q", r.Header.Get("X-Lane"), r.URL.Path)
	}
	// An invalid lane inside the mesh: baseline, and nothing stale travels on.
	if code, body := get(t, bg(t), pc, gw.URL+"/b", "X-Lane", "-bad", "Baggage", "lane=x,team=y"); code != 200 || body != "base" {
		t.Fatalf("invalid lane: %d %q", code, body)
	}
	if r, _ := base.lastRequest(); r.Header.Get("X-Lane") != "" || withoutKey(r.Header.Get("Baggage")) != "team=y" {
		t.Fatalf("baseline got x-lane %q baggage %q", r.Header.Get("X-Lane"), r.Header.Get("Baggage"))
	}
	code, body, hdr, err := call(bg(t), pc, http.MethodGet, gw.URL+"/c", nil, "X-Lane", "dave")
	if err != nil || code != 503 || hdr.Get("X-Lanes-Error") != "lane_unavailable" || !strings.Contains(body, `"dave"`) || !strings.Contains(body, `"orders"`) {
		t.Fatalf("strict lane: %d %q %v %v", code, body, hdr, err)
	}
}

// TestOtherHosts: hosts that are not lanes services go to the base
// transport untouched, or are refused.
func TestOtherHosts(t *testing.T) {
	f := newFleet(t, "")
	b := f.start("base orders")
	ctx := lane.WithLane(bg(t), "alice")

	code, body := get(t, ctx, f.client(), b.srv.URL+"/direct", "X-Lane", "bob")
	if code != 200 || body != "base" {
		t.Fatalf("got %d %q", code, body)
	}
	if r, _ := b.lastRequest(); r.Header.Get("X-Lane") != "bob" || r.Header.Get("Baggage") != "" {
		t.Fatalf("a passed-through request was changed: %v", r.Header)
	}

	hits := b.hits.Load()
	_, _, _, err := call(ctx, f.client(laneshttp.WithRefuseOthers()), http.MethodGet, b.srv.URL, nil)
	if !errors.Is(err, laneshttp.ErrNotService) || b.hits.Load() != hits {
		t.Fatalf("refused: %v, hits %d -> %d", err, hits, b.hits.Load())
	}

	// WithServices: only the listed names are routed.
	only := f.client(laneshttp.WithServices(laneshttp.ServiceNames("payments")), laneshttp.WithRefuseOthers())
	if _, _, _, err := call(ctx, only, http.MethodGet, "http://orders/", nil); !errors.Is(err, laneshttp.ErrNotService) {
		t.Fatalf("orders is not listed: %v", err)
	}
}

func TestSingleLabel(t *testing.T) {
	for host, want := range map[string]bool{
		"orders": true, "orders-v2": true, "Orders_1": true,
		"": false, "localhost": false, "127.0.0.1": false, "::1": false, "api.example.com": false, "orders.default.svc": false,
	} {
		if got := laneshttp.SingleLabel(host); got != want {
			t.Errorf("SingleLabel(%q) = %v", host, got)
		}
	}
}

// TestFirstCallWaitsForTheRegistry: the first request to a service does not
// fail for want of the registry's first listing.
func TestFirstCallWaitsForTheRegistry(t *testing.T) {
	for i := range 5 {
		f := newFleet(t, "")
		f.start("base orders")
		// No await: the engine has never heard of orders.
		if code, body := get(t, bg(t), f.client(), "http://orders/"); code != 200 || body != "base" {
			t.Fatalf("round %d: %d %q", i, code, body)
		}
	}
}

// TestNewLaneInstanceTakesItsTraffic: a lane instance that registers takes
// its lane's requests as soon as the callers' engines see it.
func TestNewLaneInstanceTakesItsTraffic(t *testing.T) {
	f := newFleet(t, "")
	f.start("base orders")
	f.await("orders", 1)
	c := f.client()
	ctx := lane.WithLane(bg(t), "alice")
	if _, body := get(t, ctx, c, "http://orders/"); body != "base" {
		t.Fatalf("before: %q", body)
	}
	f.start("alice orders lane=alice")
	waitFor(t, "alice's requests to reach alice", func() bool {
		_, body := get(t, ctx, c, "http://orders/")
		return body == "alice"
	})
	for range 10 {
		if _, body := get(t, ctx, c, "http://orders/"); body != "alice" {
			t.Fatalf("after: %q", body)
		}
		if _, body := get(t, bg(t), c, "http://orders/"); body != "base" {
			t.Fatalf("baseline after: %q", body)
		}
	}
}

// TestOutlierEjectionAndProbe: 5xx answers eject an instance; after the
// ejection a probe restores it.
func TestOutlierEjectionAndProbe(t *testing.T) {
	clock := routing.NewManualClock(time.Unix(1_700_000_000, 0))
	f := newFleet(t, "outlier: {errors: 2, window: 30s, ejection: 10s}\n", routing.WithClock(clock))
	bad := f.start("bad orders")
	f.start("good orders")
	f.await("orders", 2)
	c := f.client()
	bad.status.Store(500)

	fails := 0
	for range 20 {
		code, body := get(t, bg(t), c, "http://orders/")
		if code == 500 {
			fails++
			if body != "bad" {
				t.Fatalf("500 from %q", body)
			}
		}
	}
	if fails != 2 {
		t.Fatalf("%d failures before the ejection, want 2", fails)
	}
	before := bad.hits.Load()
	for range 10 {
		if _, body := get(t, bg(t), c, "http://orders/"); body != "good" {
			t.Fatalf("the ejected instance served: %q", body)
		}
	}

	bad.status.Store(0) // it recovers
	clock.Advance(11 * time.Second)
	if _, body := get(t, bg(t), c, "http://orders/"); body != "bad" {
		t.Fatalf("the first request after the ejection is not the probe: %q", body)
	}
	seen := map[string]int{}
	for range 10 {
		_, body := get(t, bg(t), c, "http://orders/")
		seen[body]++
	}
	if seen["bad"] != 5 || seen["good"] != 5 || bad.hits.Load() != before+6 {
		t.Fatalf("after the probe: %v, want round robin again", seen)
	}
}

// TestCallerTimeoutIsNotAFailure: a request whose caller gives up says
// nothing about the instance, and is not retried past the deadline.
func TestCallerTimeoutIsNotAFailure(t *testing.T) {
	clock := routing.NewManualClock(time.Unix(1_700_000_000, 0))
	f := newFleet(t, "outlier: {errors: 1, window: 30s, ejection: 10s}\n", routing.WithClock(clock))
	release := make(chan struct{})
	f.start("slow orders", func(_ registry.Instance, h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			h.ServeHTTP(w, r)
		})
	})
	f.start("fast orders")
	f.await("orders", 2)
	c := f.client()
	timeouts := 0
	for range 4 {
		ctx, cancel := context.WithTimeout(bg(t), 100*time.Millisecond)
		_, body, _, err := call(ctx, c, http.MethodGet, "http://orders/", nil)
		cancel()
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			timeouts++
		case err != nil || body != "fast":
			t.Fatalf("got %q, %v", body, err)
		}
	}
	if timeouts == 0 {
		t.Fatal("no request reached the slow instance")
	}
	close(release)
	seen := map[string]int{}
	for range 4 {
		_, body := get(t, bg(t), c, "http://orders/")
		seen[body]++
	}
	if seen["slow"] != 2 || seen["fast"] != 2 {
		t.Fatalf("after its callers' timeouts: %v; the slow instance was ejected", seen)
	}
}

func TestDefaultClassify(t *testing.T) {
	req, _ := http.NewRequest(http.MethodGet, "http://orders/", nil)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	resp := func(code int, h ...string) *http.Response {
		r := &http.Response{StatusCode: code, Header: http.Header{}}
		for i := 0; i+1 < len(h); i += 2 {
			r.Header.Set(h[i], h[i+1])
		}
		return r
	}
	for _, tc := range []struct {
		name string
		req  *http.Request
		res  *http.Response
		err  error
		want laneshttp.Outcome
	}{
		{"200", req, resp(200), nil, laneshttp.Success},
		{"404", req, resp(404), nil, laneshttp.Success},
		{"421 from the guard", req, resp(421, "X-Lanes-Error", "misdirected"), nil, laneshttp.Success},
		{"500", req, resp(500), nil, laneshttp.Failure},
		{"503", req, resp(503), nil, laneshttp.Failure},
		{"503 routing failure downstream", req, resp(503, "X-Lanes-Error", "no_instance"), nil, laneshttp.Success},
		{"connection error", req, nil, errors.New("connection refused"), laneshttp.Failure},
		{"caller gave up", req.WithContext(done), nil, context.Canceled, laneshttp.Ignore},
	} {
		if got := laneshttp.DefaultClassify(tc.req, tc.res, tc.err); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestIsIdempotent(t *testing.T) {
	for m, want := range map[string]bool{"GET": true, "HEAD": true, "OPTIONS": true, "TRACE": true, "PUT": true, "DELETE": true, "POST": false, "PATCH": false} {
		req, _ := http.NewRequest(m, "http://orders/", nil)
		if laneshttp.IsIdempotent(req) != want {
			t.Errorf("%s: %v", m, !want)
		}
	}
	req, _ := http.NewRequest("POST", "http://orders/", bytes.NewReader(nil))
	req.Header.Set("Idempotency-Key", "k1")
	if !laneshttp.IsIdempotent(req) {
		t.Error("POST with Idempotency-Key")
	}
}

// TestNilOptionsAreDefaults: a client option given nil restores its default
// (docs/http.md, Options): the single-label services, IsIdempotent (a GET
// that fails is retried), no retried status, DefaultClassify.
func TestNilOptionsAreDefaults(t *testing.T) {
	f := newFleet(t, "")
	var cut atomic.Int64
	f.start("o1 orders", func(registry.Instance, http.Handler) http.Handler {
		return http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			cut.Add(1)
			panic(http.ErrAbortHandler) // the connection is cut: a failure, before any answer
		})
	})
	good := f.start("o2 orders")
	f.await("orders", 2)
	c := f.client(laneshttp.WithServices(nil), laneshttp.WithIdempotent(nil), laneshttp.WithRetryStatus(nil), laneshttp.WithClassify(nil))
	for range 4 {
		if code, body := get(t, bg(t), c, "http://orders/x"); code != 200 || body != good.id {
			t.Fatalf("%d %q, want 200 from %s", code, body, good.id)
		}
	}
	if cut.Load() == 0 {
		t.Fatal("no request went to the instance that cuts them: nothing was retried")
	}
}

// TestZeroTransport: a Transport not made by NewTransport has no engine: it
// fails a request to a lanes service with an error that says so, and closes
// its body.
func TestZeroTransport(t *testing.T) {
	body := &closeRecorder{Reader: strings.NewReader("x")}
	req, _ := http.NewRequestWithContext(bg(t), http.MethodPost, "http://orders/", body)
	if _, err := new(laneshttp.Transport).RoundTrip(req); err == nil || !strings.Contains(err.Error(), "NewTransport") {
		t.Fatalf("error %v, want one that names NewTransport", err)
	}
	if !body.closed {
		t.Fatal("the request body was not closed")
	}
}
