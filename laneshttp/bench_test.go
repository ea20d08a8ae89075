package laneshttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/benchcpu"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// benchEngine returns an engine whose service orders has one baseline
// instance at addr.
func benchEngine(tb testing.TB, addr string) *routing.Engine {
	in, err := registry.Normalize(registry.Instance{ID: "o1", Service: "orders", Addr: addr})
	if err != nil {
		tb.Fatal(err)
	}
	e := routing.New(routing.WithLogger(quiet))
	tb.Cleanup(func() { e.Close() })
	e.SetInstances("orders", []registry.Instance{in})
	return e
}

// okServer answers "ok" to everything.
func okServer(tb testing.TB) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	tb.Cleanup(srv.Close)
	return srv
}

// newBase returns the base transport of both sides of the comparison: the
// same keep-alive settings.
func newBase(tb testing.TB) *http.Transport {
	tr := &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}
	tb.Cleanup(tr.CloseIdleConnections)
	return tr
}

func do(tb testing.TB, c *http.Client, req *http.Request) {
	res, err := c.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != 200 {
		tb.Fatalf("status %d", res.StatusCode)
	}
}

// BenchmarkRoundTrip compares a GET through the lanes Transport with the
// same GET through a plain http.Transport, to the same loopback server, with
// the same keep-alive settings:
//
//   - plain: the plain transport;
//   - lanes: a baseline request through lanes;
//   - lanes-lane: a request in lane alice, which falls back to the baseline
//     instance, so that the lane headers are written and parsed;
//   - cpu-vs-plain/lanes and cpu-vs-plain/lanes-lane: the lanes requests
//     and plain ones in alternating chunks; they report x-plain (wall time
//     over plain's) and x-plain-cpu (the process's CPU time over plain's,
//     which a loaded machine disturbs least);
//   - cpu-vs-plain-with-lane-headers/lanes-lane: the same for a lane
//     request against a plain request that carries the same x-lane and
//     baggage headers, set by hand: what lanes itself costs;
//   - interleaved: one of each per iteration, each timed on its own; it
//     reports the ratios x-plain-baseline and x-plain-lane (lanes time over
//     plain time), which stay meaningful on a busy machine since the three
//     share its noise;
//   - traced/...: the same GETs with tracing on, against plain otelhttp (see
//     benchTracedRoundTrip).
func BenchmarkRoundTrip(b *testing.B) {
	srv := okServer(b)
	e := benchEngine(b, srv.Listener.Addr().String())
	type client struct {
		c   *http.Client
		req *http.Request
	}
	clients := func(b *testing.B) (plain, lanes, laneReq client) {
		mk := func(rt http.RoundTripper, ctx context.Context, url string) client {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				b.Fatal(err)
			}
			c := client{&http.Client{Transport: rt}, req}
			do(b, c.c, c.req) // connect outside the measurement
			return c
		}
		plain = mk(newBase(b), context.Background(), srv.URL+"/x")
		lanes = mk(laneshttp.NewTransport(e, laneshttp.WithBase(newBase(b))), context.Background(), "http://orders/x")
		laneReq = mk(laneshttp.NewTransport(e, laneshttp.WithBase(newBase(b))), lane.WithLane(context.Background(), "alice"), "http://orders/x")
		return
	}
	for _, name := range []string{"plain", "lanes", "lanes-lane"} {
		b.Run(name, func(b *testing.B) {
			plain, lanes, laneReq := clients(b)
			c := map[string]client{"plain": plain, "lanes": lanes, "lanes-lane": laneReq}[name]
			b.ReportAllocs()
			for b.Loop() {
				do(b, c.c, c.req)
			}
		})
	}
	// The same comparisons by CPU time, which a loaded machine disturbs less
	// than wall time: client and server run in this process.
	for _, name := range []string{"lanes", "lanes-lane"} {
		b.Run("cpu-vs-plain/"+name, func(b *testing.B) {
			plain, lanes, laneReq := clients(b)
			c := map[string]client{"lanes": lanes, "lanes-lane": laneReq}[name]
			b.ReportAllocs()
			b.ResetTimer()
			wall, cpu := benchcpu.Compare(b, 64, func() { do(b, c.c, c.req) }, func() { do(b, plain.c, plain.req) })
			b.StopTimer()
			b.ReportMetric(wall, "x-plain")
			if cpu > 0 {
				b.ReportMetric(cpu, "x-plain-cpu")
			}
		})
	}
	// What lanes itself costs: a lane request against a plain one that
	// carries the same lane headers, written by hand (the server's share of
	// reading two more headers is then on both sides).
	b.Run("cpu-vs-plain-with-lane-headers/lanes-lane", func(b *testing.B) {
		plain, _, laneReq := clients(b)
		plain.req.Header.Set("X-Lane", "alice")
		plain.req.Header.Set("Baggage", "lane=alice")
		b.ReportAllocs()
		b.ResetTimer()
		wall, cpu := benchcpu.Compare(b, 64, func() { do(b, laneReq.c, laneReq.req) }, func() { do(b, plain.c, plain.req) })
		b.StopTimer()
		b.ReportMetric(wall, "x-plain")
		if cpu > 0 {
			b.ReportMetric(cpu, "x-plain-cpu")
		}
	})
	// The floor of a lane request: a plain request with the lane headers
	// against a plain one without, that is what writing and parsing two
	// more headers costs net/http.
	b.Run("cpu-vs-plain/plain-with-lane-headers", func(b *testing.B) {
		plain, _, _ := clients(b)
		other, _, _ := clients(b)
		other.req.Header.Set("X-Lane", "alice")
		other.req.Header.Set("Baggage", "lane=alice")
		b.ReportAllocs()
		b.ResetTimer()
		wall, cpu := benchcpu.Compare(b, 64, func() { do(b, other.c, other.req) }, func() { do(b, plain.c, plain.req) })
		b.StopTimer()
		b.ReportMetric(wall, "x-plain")
		if cpu > 0 {
			b.ReportMetric(cpu, "x-plain-cpu")
		}
	})
	b.Run("interleaved", func(b *testing.B) {
		plain, lanes, laneReq := clients(b)
		var spent [3]time.Duration
		for b.Loop() {
			for i, c := range [...]client{plain, lanes, laneReq} {
				start := time.Now()
				do(b, c.c, c.req)
				spent[i] += time.Since(start)
			}
		}
		b.ReportMetric(float64(spent[1])/float64(spent[0]), "x-plain-baseline")
		b.ReportMetric(float64(spent[2])/float64(spent[0]), "x-plain-lane")
	})
	// With tracing on: lanes against plain otelhttp (benchTracedRoundTrip).
	b.Run("traced", benchTracedRoundTrip)
}

// stubBase answers every request with the same response, without a network:
// the allocations measured through it are those of the transport alone.
type stubBase struct{ res *http.Response }

func (s stubBase) RoundTrip(*http.Request) (*http.Response, error) { return s.res, nil }

// BenchmarkTransportAlone is what the lanes Transport itself spends on a
// request, through a base that answers without a network (stubBase): the
// route check, the pick and its report, the outbound copy and the lane
// headers. A baseline request, and one in lane alice, which falls back to
// the baseline instance.
func BenchmarkTransportAlone(b *testing.B) {
	e := benchEngine(b, "127.0.0.1:1")
	stub := stubBase{&http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}}
	tr := laneshttp.NewTransport(e, laneshttp.WithBase(stub))
	for _, tc := range []struct{ name, lane string }{{"baseline", ""}, {"lane", "alice"}} {
		b.Run(tc.name, func(b *testing.B) {
			req, err := http.NewRequestWithContext(lane.WithLane(context.Background(), tc.lane), http.MethodGet, "http://orders/x", nil)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				res, err := tr.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				res.Body.Close()
			}
		})
	}
}

// TestRoundTripAllocs bounds what the lanes Transport allocates per request
// on top of its base transport: the shallow copy of the request and of its
// URL, in one allocation (the RoundTripper contract forbids changing the
// caller's), plus, for a
// request that carries a lane and other headers, a copy of the headers and
// the lane headers (a request with no other headers is sent with the
// lane's headers, built once per lane).
// The pick itself allocates nothing.
func TestRoundTripAllocs(t *testing.T) {
	e := benchEngine(t, "127.0.0.1:1")
	stub := stubBase{&http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}}
	tr := laneshttp.NewTransport(e, laneshttp.WithBase(stub))
	for _, tc := range []struct {
		name string
		lane string
		hdr  []string
		max  float64
	}{
		{"baseline", "", nil, 1},
		{"baseline with other headers", "", []string{"Accept", "*/*", "Baggage", "team=x"}, 1},
		{"lane", "alice", nil, 1},
		{"lane with other headers", "alice", []string{"Accept", "*/*", "Baggage", "team=x"}, 6},
		{"baseline with stale lane headers", "", []string{"X-Lane", "bob", "Baggage", "lane=bob,team=x"}, 6},
	} {
		req, _ := http.NewRequestWithContext(lane.WithLane(context.Background(), tc.lane), http.MethodGet, "http://orders/x", nil)
		for i := 0; i+1 < len(tc.hdr); i += 2 {
			req.Header.Set(tc.hdr[i], tc.hdr[i+1])
		}
		plain := testing.AllocsPerRun(200, func() { stub.RoundTrip(req) })
		lanes := testing.AllocsPerRun(200, func() {
			if _, err := tr.RoundTrip(req); err != nil {
				t.Fatal(err)
			}
		})
		t.Logf("%s: %v allocations on top of the base transport", tc.name, lanes-plain)
		if lanes-plain > tc.max {
			t.Errorf("%s: %v allocations on top of the base transport, want at most %v", tc.name, lanes-plain, tc.max)
		}
	}
}

// TestRoundTripAllocsOverLoopback compares a whole GET over loopback through
// lanes and through a plain transport: the difference must stay small. It
// includes the server's parsing of the lane headers, and is a bound, not a
// count: other goroutines may allocate meanwhile.
func TestRoundTripAllocsOverLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	srv := okServer(t)
	e := benchEngine(t, srv.Listener.Addr().String())
	measure := func(c *http.Client, ctx context.Context, url string) float64 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		do(t, c, req)
		return testing.AllocsPerRun(200, func() { do(t, c, req) })
	}
	plain := measure(&http.Client{Transport: newBase(t)}, context.Background(), srv.URL+"/x")
	for _, l := range []string{"", "alice"} {
		lanes := measure(&http.Client{Transport: laneshttp.NewTransport(e, laneshttp.WithBase(newBase(t)))}, lane.WithLane(context.Background(), l), "http://orders/x")
		t.Logf("lane %q: plain %v, lanes %v allocations per GET", l, plain, lanes)
		if lanes-plain > 20 {
			t.Errorf("lane %q: lanes %v vs plain %v allocations per GET", l, lanes, plain)
		}
	}
}
