package laneshttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/lanesdev/lanes/internal/testkit/benchcpu"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
)

// benchTracedRoundTrip is BenchmarkRoundTrip's "traced" cases: what tracing through lanes costs.
// A GET traced by lanes (the Transport's client span with the routing decision, and Handler's
// otelhttp server span with the hop's server side) against the same GET traced by plain otelhttp
// on both sides. Both propagate the trace context (W3C traceparent), as a traced fleet does:
// otelhttp's default propagator is OpenTelemetry's global one, which writes nothing until a
// program sets one. The spans are sampled and dropped (no exporter).
//
//   - plain-otel, lanes-traced, lanes-traced-lane: each alone, for its allocations;
//   - cpu-vs-plain-otel/lanes-traced and cpu-vs-plain-otel/lanes-traced-lane: a baseline GET,
//     and one in lane alice (which falls back to the baseline), against the plain otelhttp GET,
//     in alternating chunks (x-otelhttp: wall time; x-otelhttp-cpu: the process's CPU time,
//     which a loaded machine disturbs least);
//   - cpu-vs-plain-otel-with-lane-headers/lanes-traced-lane: the same against a plain otelhttp
//     GET that carries the same lane headers, set by hand: what lanes itself costs.
func benchTracedRoundTrip(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer tp.Shutdown(context.Background())
	tc := otelhttp.WithPropagators(propagation.TraceContext{})
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	lanesSrv := httptest.NewServer(laneshttp.Handler(ok, laneshttp.WithTracerProvider(tp)))
	defer lanesSrv.Close()
	otelSrv := httptest.NewServer(otelhttp.NewHandler(ok, "ok", otelhttp.WithTracerProvider(tp), tc))
	defer otelSrv.Close()
	e := benchEngine(b, lanesSrv.Listener.Addr().String())
	traced := laneshttp.NewClient(e, laneshttp.WithBase(newBase(b)), laneshttp.WithEnv(noEnv), laneshttp.WithTracerProvider(tp))
	otel := &http.Client{Transport: otelhttp.NewTransport(newBase(b), otelhttp.WithTracerProvider(tp), tc)}
	request := func(ctx context.Context, url string, h ...string) *http.Request {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; i+1 < len(h); i += 2 {
			req.Header.Set(h[i], h[i+1])
		}
		return req
	}
	bg := context.Background()
	lanesReq := request(bg, "http://orders/")
	laneReq := request(lane.WithLane(bg, "alice"), "http://orders/")
	otelReq := request(bg, otelSrv.URL+"/")
	otelLaneReq := request(bg, otelSrv.URL+"/", "X-Lane", "alice", "Baggage", "lane=alice")
	alone := func(c *http.Client, req *http.Request) func(*testing.B) {
		return func(b *testing.B) {
			do(b, c, req)
			b.ReportAllocs()
			for b.Loop() {
				do(b, c, req)
			}
		}
	}
	compare := func(req, ref *http.Request) func(*testing.B) {
		return func(b *testing.B) {
			do(b, traced, req)
			do(b, otel, ref)
			b.ReportAllocs()
			b.ResetTimer()
			wall, cpu := benchcpu.Compare(b, 64, func() { do(b, traced, req) }, func() { do(b, otel, ref) })
			b.StopTimer()
			b.ReportMetric(wall, "x-otelhttp")
			if cpu > 0 {
				b.ReportMetric(cpu, "x-otelhttp-cpu")
			}
		}
	}
	b.Run("plain-otel", alone(otel, otelReq))
	b.Run("lanes-traced", alone(traced, lanesReq))
	b.Run("lanes-traced-lane", alone(traced, laneReq))
	b.Run("cpu-vs-plain-otel/lanes-traced", compare(lanesReq, otelReq))
	b.Run("cpu-vs-plain-otel/lanes-traced-lane", compare(laneReq, otelReq))
	b.Run("cpu-vs-plain-otel-with-lane-headers/lanes-traced-lane", compare(laneReq, otelLaneReq))
}
