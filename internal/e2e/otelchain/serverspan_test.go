package otelchain

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/internal/testkit/timing"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/lanestrace"
)

// TestOneServerSpanPerRequest: with lanes' tracing on, a service that traces its handler with
// otelhttp too, inside the lanes middleware (as laneshttp.Serve places it) or outside, gets one
// server span per request: the application's, carrying lanes' attributes, and the parent of the
// spans the handler starts.
func TestOneServerSpanPerRequest(t *testing.T) {
	for _, o := range []order{lanesOutside, otelOutside} {
		t.Run(string(o), func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			t.Cleanup(func() { tp.Shutdown(context.Background()) })
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, work := trace.SpanFromContext(r.Context()).TracerProvider().Tracer("app").Start(r.Context(), "work")
				work.End()
				io.WriteString(w, "ok")
			})
			lanesOpts := []laneshttp.ServerOption{laneshttp.WithTracerProvider(tp), laneshttp.WithLogger(quiet)}
			var srv http.Handler
			if o == lanesOutside {
				// The application's otelhttp takes its provider from the request's span, as it
				// does when given none and the global one is lanes' (lanestrace.FromEnv).
				srv = laneshttp.Handler(otelhttp.NewHandler(h, "orders"), lanesOpts...)
			} else {
				srv = otelhttp.NewHandler(laneshttp.Handler(h, lanesOpts...), "orders", otelhttp.WithTracerProvider(tp))
			}
			s := httptest.NewServer(srv)
			t.Cleanup(s.Close)
			base := &http.Transport{}
			t.Cleanup(base.CloseIdleConnections)
			c := &http.Client{Transport: otelhttp.NewTransport(base, otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagation.TraceContext{}))}
			for i := 0; i < 3; i++ {
				req, _ := http.NewRequest("GET", s.URL+"/", nil)
				req.Header.Set("x-lane", "alice")
				res, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
			waitFor(t, "the spans of 3 requests", func() bool { return len(rec.Ended()) >= 9 })
			var servers []sdktrace.ReadOnlySpan
			parents := map[trace.SpanID]int{}
			for _, sp := range rec.Ended() {
				switch sp.SpanKind() {
				case trace.SpanKindServer:
					servers = append(servers, sp)
				case trace.SpanKindInternal:
					parents[sp.Parent().SpanID()]++
				}
			}
			if len(servers) != 3 || len(rec.Ended()) != 9 {
				t.Fatalf("%d server spans of %d spans for 3 requests, want 3 of 9", len(servers), len(rec.Ended()))
			}
			for _, sp := range servers {
				var requested string
				for _, kv := range sp.Attributes() {
					if kv.Key == lanestrace.Requested {
						requested = kv.Value.AsString()
					}
				}
				if requested != "alice" || parents[sp.SpanContext().SpanID()] != 1 {
					t.Errorf("server span %q: lane.requested=%q, parent of %d handler spans; want alice, 1", sp.Name(), requested, parents[sp.SpanContext().SpanID()])
				}
			}
		})
	}
}

// waitFor polls ok until it holds or patience passes.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	timing.Until(t, what, patience, ok)
}
