package laneshttp_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lanesdev/lanes/internal/testkit/buftest"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// laneEcho answers the lane of the request's context.
var laneEcho = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	l := lane.FromContext(r.Context())
	if l == "" {
		l = "(baseline)"
	}
	w.Write([]byte(l))
})

func serveOnce(h http.Handler, path string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestHandlerReadsTheLane: the lane of the headers ends up in the context.
func TestHandlerReadsTheLane(t *testing.T) {
	h := laneshttp.Handler(laneEcho, laneshttp.WithLogger(quiet), laneshttp.WithPropagator(lane.Propagator{Aliases: []string{"dubbo.tag"}}))
	for _, tc := range []struct {
		hdr  []string
		want string
	}{
		{nil, "(baseline)"},
		{[]string{"X-Lane", " Alice "}, "alice"},
		{[]string{"Baggage", "team=x,lane=bob"}, "bob"},
		{[]string{"X-Lane", "alice", "Baggage", "lane=bob"}, "alice"},
		{[]string{"dubbo.tag", "carol"}, "carol"},
	} {
		if got := serveOnce(h, "/", tc.hdr...).Body.String(); got != tc.want {
			t.Errorf("%q: lane %q, want %q", tc.hdr, got, tc.want)
		}
	}
	if h.InvalidLanes() != 0 {
		t.Fatal("counted an invalid lane")
	}
}

// TestHandlerIgnoresInvalidLane: inside the mesh an invalid lane is served
// as baseline, counted, and logged (at most once a second).
func TestHandlerIgnoresInvalidLane(t *testing.T) {
	var buf buftest.Buffer
	h := laneshttp.Handler(laneEcho, laneshttp.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	for range 3 {
		if got := serveOnce(h, "/", "X-Lane", "-alice").Body.String(); got != "(baseline)" {
			t.Fatalf("lane %q", got)
		}
	}
	if h.InvalidLanes() != 3 {
		t.Fatalf("counted %d", h.InvalidLanes())
	}
	log := buf.String()
	if n := strings.Count(log, "invalid lane"); n < 1 || n > 3 || !strings.Contains(log, "rule=starts-or-ends") || !strings.Contains(log, "header=x-lane") {
		t.Fatalf("log: %s", log)
	}
}

func guardEngine(t *testing.T, pol string) *routing.Engine {
	f := newFleet(t, pol)
	return f.e
}

// TestGuard: a lane instance refuses what its lane chain does not reach,
// with 421 naming its lane; health and metrics paths are exempt.
func TestGuard(t *testing.T) {
	e := guardEngine(t, "lanes:\n  bob: {fallback: [alice]}\n")
	inst := registry.Instance{ID: "a1", Service: "orders", Addr: "127.0.0.1:1", Lane: "alice"}
	h := laneshttp.Handler(laneEcho, laneshttp.WithGuard(guardFor(e, inst)), laneshttp.WithLogger(quiet))
	if !h.Guarded() {
		t.Fatal("not guarded")
	}
	for _, tc := range []struct {
		path string
		hdr  []string
		want int
	}{
		{"/", []string{"X-Lane", "alice"}, 200},
		{"/", []string{"Baggage", "lane=alice"}, 200},
		{"/", []string{"X-Lane", "bob"}, 200}, // bob falls back to alice
		{"/", nil, 421},
		{"/", []string{"X-Lane", "carol"}, 421},
		{"/", []string{"X-Lane", "-invalid"}, 421}, // invalid: a baseline request
		{"/healthz", nil, 200},
		{"/readyz", nil, 200},
		{"/livez/ping", nil, 200},
		{"/metrics", nil, 200},
		{"/healthzz", nil, 421},
	} {
		w := serveOnce(h, tc.path, tc.hdr...)
		if w.Code != tc.want {
			t.Errorf("%s %q: %d, want %d", tc.path, tc.hdr, w.Code, tc.want)
			continue
		}
		if w.Code == 421 {
			if w.Header().Get("X-Lanes-Error") != "misdirected" || !strings.Contains(w.Body.String(), `serves lane "alice"`) || !strings.Contains(w.Body.String(), `"orders"`) {
				t.Errorf("421 answer: %v %q", w.Header(), w.Body)
			}
		}
	}
	if h.Refused() != 4 {
		t.Fatalf("refused %d", h.Refused())
	}

	// A baseline instance admits everything.
	base := laneshttp.Handler(laneEcho, laneshttp.WithGuard(guardFor(e, registry.Instance{ID: "b1", Service: "orders", Addr: "127.0.0.1:2"})))
	for _, l := range []string{"", "alice", "carol"} {
		if w := serveOnce(base, "/", "X-Lane", l); w.Code != 200 {
			t.Errorf("baseline instance refused lane %q", l)
		}
	}

	// Exempt paths add to the defaults.
	custom := laneshttp.Handler(laneEcho, laneshttp.WithGuard(guardFor(e, inst)), laneshttp.WithExemptPaths("/ping"), laneshttp.WithLogger(quiet))
	for _, p := range []string{"/ping", "/healthz", "/_healthz", "/readyz", "/livez", "/metrics"} {
		if code := serveOnce(custom, p).Code; code != 200 {
			t.Errorf("exempt path %s: %d", p, code)
		}
	}
	if code := serveOnce(custom, "/pong").Code; code != 421 {
		t.Errorf("/pong: %d, want the guard's 421", code)
	}
}

// TestGuardFollowsTagRules: the guard serves the instance's effective lane,
// after the policy's dynamic tag rules, and follows policy changes.
func TestGuardFollowsTagRules(t *testing.T) {
	f := newFleet(t, "")
	inst := registry.Instance{ID: "g1", Service: "orders", Addr: "127.0.0.1:9090"}
	h := laneshttp.Handler(laneEcho, laneshttp.WithGuard(guardFor(f.e, inst)), laneshttp.WithLogger(quiet))
	if serveOnce(h, "/").Code != 200 {
		t.Fatal("a baseline instance refused a baseline request")
	}
	if _, err := f.pol.Put(context.Background(), []byte("tags:\n  - {service: orders, lane: gray, addrs: ['*:9090']}\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the tag rule", func() bool { return f.e.LaneOf(inst) == "gray" })
	w := serveOnce(h, "/")
	if w.Code != 421 || !strings.Contains(w.Body.String(), `"gray"`) {
		t.Fatalf("%d %q", w.Code, w.Body)
	}
	if serveOnce(h, "/", "X-Lane", "gray").Code != 200 {
		t.Fatal("gray refused")
	}
}

// TestGuardOff: without a guard, or with a guard turned off, everything is
// served.
func TestGuardOff(t *testing.T) {
	e := guardEngine(t, "")
	inst := registry.Instance{ID: "a1", Service: "orders", Addr: "127.0.0.1:1", Lane: "alice"}
	h := laneshttp.Handler(laneEcho)
	if h.Guarded() {
		t.Fatal("guarded")
	}
	if w := serveOnce(h, "/"); w.Code != 200 || w.Body.String() != "(baseline)" {
		t.Fatalf("%d %q", w.Code, w.Body)
	}
	g := guardFor(e, inst)
	g.SetEnabled(false)
	if w := serveOnce(laneshttp.Handler(laneEcho, laneshttp.WithGuard(g)), "/"); w.Code != 200 {
		t.Fatalf("a guard turned off: %d %q", w.Code, w.Body)
	}
}

// TestGuardOverHTTP: the guard over a real connection, called by a plain
// client that does not go through lanes.
func TestGuardOverHTTP(t *testing.T) {
	f := newFleet(t, "")
	alice := f.start("alice orders lane=alice", func(in registry.Instance, h http.Handler) http.Handler {
		return laneshttp.Handler(h, laneshttp.WithGuard(guardFor(f.e, in)), laneshttp.WithLogger(quiet))
	})
	c := plainClient(t)
	code, body, hdr, err := call(bg(t), c, http.MethodGet, alice.srv.URL+"/orders", nil)
	if err != nil || code != http.StatusMisdirectedRequest || hdr.Get("X-Lanes-Error") != "misdirected" || !strings.Contains(body, `serves lane "alice"`) {
		t.Fatalf("%d %q %v %v", code, body, hdr, err)
	}
	if code, _ := get(t, bg(t), c, alice.srv.URL+"/healthz"); code != 200 {
		t.Fatalf("health check: %d", code)
	}
	if code, body := get(t, bg(t), c, alice.srv.URL+"/orders", "X-Lane", "alice"); code != 200 || body != "alice" {
		t.Fatalf("%d %q", code, body)
	}
	if alice.hits.Load() != 2 {
		t.Fatalf("the handler ran %d times, want 2", alice.hits.Load())
	}
}
