package sidecar

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/lanesmetrics"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// TestStartLines: the sidecar prints its listeners, then the registration
// once it is in force, in the documented form.
func TestStartLines(t *testing.T) {
	m := newMesh(t)
	a := newApp(t, "orders", nil)
	s := m.sidecar(Config{Service: "orders", Lane: "alice", App: a.addr()})
	at := s.waitRegistered(t)
	want := regexp.MustCompile(`^sidecar: inbound 127\.0\.0\.1:\d+ -> app ` + regexp.QuoteMeta(a.addr()) + `
sidecar: outbound proxy (127\.0\.0\.1:\d+) \(HTTP_PROXY=http://(127\.0\.0\.1:\d+)\)
sidecar: registered orders lane alice at ` + regexp.QuoteMeta(at) + `
$`)
	out := s.out.String()
	if mm := want.FindStringSubmatch(out); mm == nil || mm[1] != mm[2] || mm[1] != s.ProxyAddr().String() {
		t.Fatalf("printed:\n%s", out)
	}
	if at != s.InboundAddr().String() {
		t.Errorf("registered at %s, the inbound listener is %s", at, s.InboundAddr())
	}

	d := m.sidecar(Config{Service: "pricing", Direct: true, App: a.addr()})
	d.waitRegistered(t)
	want = regexp.MustCompile(`^sidecar: direct, app ` + regexp.QuoteMeta(a.addr()) + `
sidecar: outbound proxy 127\.0\.0\.1:\d+ \(HTTP_PROXY=http://127\.0\.0\.1:\d+\)
sidecar: registered pricing baseline at ` + regexp.QuoteMeta(a.addr()) + `
$`)
	if out := d.out.String(); !want.MatchString(out) {
		t.Fatalf("direct printed:\n%s", out)
	}
}

// TestGuard: a lane sidecar refuses a baseline request as laneshttp's guard
// does (421, X-Lanes-Error: misdirected), before the app sees it; it serves
// the exempt paths; a request of its lane reaches the app with the lane's
// headers to forward.
func TestGuard(t *testing.T) {
	m := newMesh(t)
	a := newApp(t, "orders-alice", nil)
	s := m.sidecar(Config{Service: "orders", Lane: "alice", App: a.addr()})
	in := "http://" + s.waitRegistered(t)

	// The answer of laneshttp's guard itself, for the same instance.
	e := m.env()
	g := laneshttp.NewGuard(e.Engine)
	g.SetInstance(registry.Instance{Service: "orders", Lane: "alice", ID: "x", Addr: "127.0.0.1:1"})
	ref := httptestRecorder(laneshttp.Handler(http.NotFoundHandler(), laneshttp.WithGuard(g)), "/")

	code, xerr, body := get(t, http.DefaultClient, in+"/")
	if code != ref.Code || xerr != ref.Header().Get("X-Lanes-Error") || body != ref.Body.String() {
		t.Errorf("baseline request: %d %q %q; laneshttp's guard answers %d %q %q", code, xerr, body, ref.Code, ref.Header().Get("X-Lanes-Error"), ref.Body.String())
	}
	if code, _, body := get(t, http.DefaultClient, in+"/", "x-lane", "bob"); code != http.StatusMisdirectedRequest {
		t.Errorf("request in lane bob: %d %q", code, body)
	}
	if n := a.hits.Load(); n != 0 {
		t.Fatalf("the app served %d refused requests", n)
	}
	if code, _, body := get(t, http.DefaultClient, in+"/healthz"); code != http.StatusOK || body != "orders-alice" {
		t.Errorf("exempt path: %d %q", code, body)
	}
	code, _, body = get(t, http.DefaultClient, in+"/x", "baggage", "lane=alice,k=v")
	h := a.header()
	if code != http.StatusOK || body != "orders-alice" || h.Get("X-Lane") != "alice" || !strings.Contains(h.Get("Baggage"), "lane=alice") || !strings.Contains(h.Get("Baggage"), "k=v") {
		t.Errorf("alice request: %d %q; the app got x-lane %q, baggage %q", code, body, h.Get("X-Lane"), h.Get("Baggage"))
	}
	if h.Get("X-Forwarded-For") != "127.0.0.1" {
		t.Errorf("the app got X-Forwarded-For %q", h.Get("X-Forwarded-For"))
	}
	// Behind the gateway: its forwarding headers are kept, the caller appended.
	get(t, http.DefaultClient, in+"/x", "x-lane", "alice", "X-Forwarded-For", "203.0.113.7", "X-Forwarded-Proto", "https", "X-Forwarded-Host", "shop.example")
	if h := a.header(); h.Get("X-Forwarded-For") != "203.0.113.7, 127.0.0.1" || h.Get("X-Forwarded-Proto") != "https" || h.Get("X-Forwarded-Host") != "shop.example" {
		t.Errorf("the app got X-Forwarded-For %q, -Proto %q, -Host %q", h.Get("X-Forwarded-For"), h.Get("X-Forwarded-Proto"), h.Get("X-Forwarded-Host"))
	}
}

// TestOutbound: the app's calls through the proxy, in absolute form or with
// the service as the Host, are routed by the lane they carry; other hosts
// and CONNECT are refused with a clear answer, or with --pass-through sent
// on.
func TestOutbound(t *testing.T) {
	m := newMesh(t)
	base, alice := newApp(t, "back-base", nil), newApp(t, "back-alice", nil)
	m.register("back", "b-1", "", base.addr())
	m.register("back", "b-alice", "alice", alice.addr())
	front := newApp(t, "front", nil)
	pr := prometheus.NewRegistry()
	metrics, err := lanesmetrics.New(pr)
	if err != nil {
		t.Fatal(err)
	}
	s := m.sidecar(Config{Service: "front", App: front.addr(), Metrics: metrics, Gatherer: pr})
	s.waitRegistered(t)
	c := s.proxyClient(t)
	for _, tc := range []struct {
		lane []string
		want string
	}{
		{nil, "back-base"},
		{[]string{"x-lane", "alice"}, "back-alice"},
		{[]string{"baggage", "lane=alice"}, "back-alice"},
		{[]string{"x-lane", "bob"}, "back-base"},
	} {
		waitBody(t, c, "http://back/p", tc.want, tc.lane...)
		// The service as the Host of a call to the proxy's own address.
		if code, _, body := get(t, http.DefaultClient, "http://"+s.ProxyAddr().String()+"/p", append([]string{"Host", "back"}, tc.lane...)...); code != 200 || body != tc.want {
			t.Errorf("Host form %v: %d %q, want %q", tc.lane, code, body, tc.want)
		}
	}
	if h := alice.header(); h.Get("X-Lane") != "alice" {
		t.Errorf("the alice instance got x-lane %q", h.Get("X-Lane"))
	}
	// The routing decisions, counted as the SDK's transports count them.
	code, _, body := get(t, http.DefaultClient, "http://"+s.ProxyAddr().String()+"/metrics")
	if code != 200 {
		t.Errorf("/metrics: %d", code)
	}
	for _, want := range []string{
		`lanes_requests_total{lane_requested="alice",lane_served="alice",reason="none",service="back"}`,
		`lanes_requests_total{lane_requested="baseline",lane_served="baseline",reason="none",service="back"}`,
		`lanes_requests_total{lane_requested="bob",lane_served="baseline",reason="no_instance_in_lane",service="back"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, body)
		}
	}

	// An unknown service: a routing failure as laneshttp answers it.
	if code, xerr, body := get(t, c, "http://nosuch/"); code != http.StatusServiceUnavailable || xerr != "no_instance" {
		t.Errorf("unknown service: %d %q %q", code, xerr, body)
	}
	// Not a lanes service.
	code, _, body = get(t, c, "http://"+base.addr()+"/")
	if code != http.StatusBadGateway || !strings.Contains(body, "is not a lanes service") || !strings.Contains(body, "--pass-through") {
		t.Errorf("other host: %d %q", code, body)
	}
	// The proxy's own address, with no service.
	if code, _, body := get(t, http.DefaultClient, "http://"+s.ProxyAddr().String()+"/"); code != http.StatusNotFound || !strings.Contains(body, "the outbound proxy itself") {
		t.Errorf("own address: %d %q", code, body)
	}
	// CONNECT.
	req, _ := http.NewRequest(http.MethodConnect, "http://"+s.ProxyAddr().String(), nil)
	req.Host = "example.com:443"
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b := readAll(res)
	if res.StatusCode != http.StatusMethodNotAllowed || !strings.Contains(b, "CONNECT is not supported") {
		t.Errorf("CONNECT: %d %q", res.StatusCode, b)
	}

	// --pass-through: another host is proxied as it is, once.
	p := m.sidecar(Config{Service: "front2", App: front.addr(), PassThrough: true})
	p.waitRegistered(t)
	if code, _, body := get(t, p.proxyClient(t), "http://"+base.addr()+"/"); code != 200 || body != "back-base" {
		t.Errorf("pass-through: %d %q", code, body)
	}
	if v := base.header().Get("Via"); v != via {
		t.Errorf("pass-through Via %q", v)
	}
	if code, _, body := get(t, p.proxyClient(t), "http://"+base.addr()+"/", "Via", via); code != http.StatusLoopDetected {
		t.Errorf("a call that came back: %d %q", code, body)
	}
}

// TestAppStopsAnswering: the instance is registered only while the app
// answers its readiness check, and again once it answers again.
func TestAppStopsAnswering(t *testing.T) {
	m := newMesh(t)
	ready := make(chan bool, 1)
	ready <- false
	a := newApp(t, "orders", func(w http.ResponseWriter, r *http.Request) {
		ok := <-ready
		ready <- ok
		if r.URL.Path == "/ready" && !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	set := func(ok bool) { <-ready; ready <- ok }
	e := m.env()
	s := m.sidecar(Config{Service: "orders", Lane: "alice", App: a.addr(), ReadyPath: "/ready"})
	addr := s.InboundAddr().String()
	// Not ready: not registered, and checked again and again.
	for a.hits.Load() < 3 {
		time.Sleep(5 * time.Millisecond)
	}
	if r := s.Registered(); r != "" {
		t.Fatalf("registered at %s before the app was ready", r)
	}
	set(true)
	s.waitRegistered(t)
	waitListed(t, e.Engine, "orders", addr, true)
	set(false)
	waitListed(t, e.Engine, "orders", addr, false)
	if !s.out.Contains("sidecar: app " + a.addr() + " stopped answering; deregistered orders\n") {
		t.Errorf("printed:\n%s", s.out.String())
	}
	set(true)
	waitListed(t, e.Engine, "orders", addr, true)
	// The line is printed once Register returns, which the engine's watch may beat.
	deadline := time.Now().Add(patience)
	for strings.Count(s.out.String(), "sidecar: registered orders lane alice at "+addr+"\n") != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("not registered twice:\n%s", s.out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestExitDeregisters: when the sidecar is told to stop it deregisters at
// once, then drains: the instance leaves the registry while the sidecar still
// serves.
func TestExitDeregisters(t *testing.T) {
	m := newMesh(t)
	a := newApp(t, "orders", nil)
	e := m.env()
	s := m.sidecar(Config{Service: "orders", App: a.addr(), Drain: 2 * time.Second})
	in := s.waitRegistered(t)
	waitListed(t, e.Engine, "orders", in, true)
	go s.cancel()
	waitListed(t, e.Engine, "orders", in, false)
	// Still draining: it serves.
	if code, _, body := get(t, http.DefaultClient, "http://"+in+"/"); code != 200 || body != "orders" {
		t.Errorf("while draining: %d %q", code, body)
	}
	if err := <-s.done; err != nil {
		t.Fatal(err)
	}
	s.done <- nil // for the cleanup
}

// TestOutboundPickIsTheEngines: the outbound proxy sends each call where the
// routing engine's pick says, for every lane of a fleet with a fallback
// chain and a strict lane: the proxy adds no routing of its own.
func TestOutboundPickIsTheEngines(t *testing.T) {
	m := newMesh(t)
	e := m.env()
	if _, err := e.Policy.Put(context.Background(), []byte("lanes:\n  bob:\n    fallback: [alice]\n  solo:\n    strict: true\n")); err != nil {
		t.Fatal(err)
	}
	apps := map[string]*app{}
	for _, spec := range []struct{ id, lane string }{{"b1", ""}, {"b2", ""}, {"a1", "alice"}, {"a2", "alice"}, {"c1", "carol"}} {
		apps[spec.id] = newApp(t, spec.id, nil)
		m.register("back", spec.id, spec.lane, apps[spec.id].addr())
	}
	front := newApp(t, "front", nil)
	s := m.sidecar(Config{Service: "front", App: front.addr()})
	s.waitRegistered(t)
	c := s.proxyClient(t)
	svc := e.Engine.Service("back")
	deadline := time.Now().Add(patience)
	for len(svc.Instances()) < 5 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	waitBody(t, c, "http://back/", "c1", "x-lane", "carol") // the sidecar's engine sees the fleet
	for _, l := range []string{"", "alice", "bob", "carol", "dave", "solo", "Alice", "not a lane"} {
		d, err := svc.Resolve(requestIn(l))
		for range 6 {
			code, xerr, body := get(t, c, "http://back/", "x-lane", l)
			if err != nil {
				if code != http.StatusServiceUnavailable || !strings.Contains(err.Error(), xerr) || xerr == "" {
					t.Errorf("lane %q: %d %q %q; the engine fails with %v", l, code, xerr, body, err)
				}
				continue
			}
			if code != 200 || !contains(d.Eligible, body) {
				t.Errorf("lane %q: %d %q; the engine picks from %v", l, code, body, d.Eligible)
			}
		}
	}
}

// waitBody waits until a GET of url through c answers want (the engine of
// the sidecar follows the registry).
func waitBody(t testing.TB, c *http.Client, url, want string, kv ...string) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		code, _, body := get(t, c, url, kv...)
		if code == 200 && body == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s %v: %d %q, want %q", url, kv, code, body, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func readAll(res *http.Response) string {
	defer res.Body.Close()
	var b strings.Builder
	fmt.Fprint(&b, "")
	buf := make([]byte, 4096)
	for {
		n, err := res.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// requestIn is the routing request of a call whose x-lane is l, as the
// outbound proxy reads it.
func requestIn(l string) routing.Request {
	var p lane.Propagator
	h := http.Header{}
	h.Set("x-lane", l)
	return routing.RequestFromContext(p.ExtractContext(context.Background(), lane.HTTPHeader(h)), "", "")
}

// httptestRecorder is h's answer to a GET of path.
func httptestRecorder(h http.Handler, path string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec
}
