package laneshttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/lanesdev/lanes/internal/testkit/benchcpu"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
)

// BenchmarkTracedRoundTrip measures what tracing through lanes costs: a GET traced by lanes (the
// Transport's client span with the routing decision, and Handler's otelhttp server span with the
// lane received) against the same GET traced by plain otelhttp on both sides (x_otelhttp,
// x_otelhttp_cpu). The spans are sampled and dropped (no exporter).
func BenchmarkTracedRoundTrip(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer tp.Shutdown(context.Background())
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	lanesSrv := httptest.NewServer(laneshttp.Handler(ok, laneshttp.WithTracerProvider(tp)))
	defer lanesSrv.Close()
	otelSrv := httptest.NewServer(otelhttp.NewHandler(ok, "ok", otelhttp.WithTracerProvider(tp)))
	defer otelSrv.Close()
	e := benchEngine(b, lanesSrv.Listener.Addr().String())
	traced := laneshttp.NewClient(e, laneshttp.WithBase(newBase(b)), laneshttp.WithEnv(noEnv), laneshttp.WithTracerProvider(tp))
	otel := &http.Client{Transport: otelhttp.NewTransport(newBase(b), otelhttp.WithTracerProvider(tp))}
	for _, tc := range []struct {
		name string
		ctx  context.Context
	}{{"lanes_traced", context.Background()}, {"lanes_traced_in_lane", lane.WithLane(context.Background(), "alice")}} {
		b.Run(tc.name, func(b *testing.B) {
			lanesReq, _ := http.NewRequestWithContext(tc.ctx, http.MethodGet, "http://orders/", nil)
			otelReq, _ := http.NewRequest(http.MethodGet, otelSrv.URL+"/", nil)
			do(b, traced, lanesReq)
			do(b, otel, otelReq)
			b.ReportAllocs()
			b.ResetTimer()
			wall, cpu := benchcpu.Compare(b, 256, func() { do(b, traced, lanesReq) }, func() { do(b, otel, otelReq) })
			b.StopTimer()
			b.ReportMetric(wall, "x_otelhttp")
			if cpu > 0 {
				b.ReportMetric(cpu, "x_otelhttp_cpu")
			}
		})
	}
}
