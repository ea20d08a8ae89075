package laneshttp_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/lanesmetrics"
	"github.com/lanesdev/lanes/lanestrace"
	"github.com/lanesdev/lanes/registry"
)

func attrsOf(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

// TestTracing traces a lane request that falls back: the Transport's client span carries the
// routing decision and the traceparent it sends; the instance's otelhttp server span, in the same
// trace, the lane received, the instance's lane and the guard's verdict.
func TestTracing(t *testing.T) {
	f := newFleet(t, "")
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	b := f.start("orders-1 orders", func(in registry.Instance, h http.Handler) http.Handler {
		return laneshttp.Handler(h, laneshttp.WithGuard(guardFor(f.e, in)), laneshttp.WithTracerProvider(tp))
	})
	f.start("orders-bob orders lane=bob")
	f.await("orders", 2)
	c := f.client(laneshttp.WithTracerProvider(tp))
	ctx := lane.WithLane(bg(t), "alice")
	if code, body := get(t, ctx, c, "http://orders/x"); code != 200 || body != "orders-1" {
		t.Fatalf("%d %s", code, body)
	}
	waitFor(t, "two spans", func() bool { return len(rec.Ended()) >= 2 })
	var client, server sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.SpanKind() {
		case trace.SpanKindClient:
			client = s
		case trace.SpanKindServer:
			server = s
		}
	}
	if client == nil || server == nil {
		t.Fatalf("spans: %v", rec.Ended())
	}
	ca := attrsOf(client)
	for k, want := range map[attribute.Key]string{
		lanestrace.Service: "orders", lanestrace.Requested: "alice", lanestrace.Served: "",
		lanestrace.FallbackReason: lanestrace.ReasonNoInstanceInLane, lanestrace.InstanceID: "orders-1",
		lanestrace.InstanceAddr: b.inst.Addr, "http.request.method": "GET",
	} {
		if got := ca[k].AsString(); got != want {
			t.Errorf("client span %s = %q, want %q", k, got, want)
		}
	}
	if ca["http.response.status_code"].AsInt64() != 200 || ca[lanestrace.Eligible].AsInt64() != 1 {
		t.Errorf("client span %v", ca)
	}
	sa := attrsOf(server)
	if sa[lanestrace.Requested].AsString() != "alice" || sa[lanestrace.InstanceLane].AsString() != "" || !sa[lanestrace.GuardAdmitted].AsBool() {
		t.Errorf("server span %v", sa)
	}
	if server.Parent().SpanID() != client.SpanContext().SpanID() || server.SpanContext().TraceID() != client.SpanContext().TraceID() {
		t.Errorf("the server span is not the client span's child")
	}
	req, _ := b.lastRequest()
	if req.Header.Get("traceparent") == "" {
		t.Error("no traceparent header sent")
	}
}

// TestTracingOff: without a provider, no span and no traceparent.
func TestTracingOff(t *testing.T) {
	f := newFleet(t, "")
	b := f.start("orders-1 orders")
	f.await("orders", 1)
	if code, _ := get(t, bg(t), f.client(), "http://orders/x"); code != 200 {
		t.Fatal(code)
	}
	if req, _ := b.lastRequest(); req.Header.Get("traceparent") != "" {
		t.Errorf("an untraced request sent traceparent %q", req.Header.Get("traceparent"))
	}
}

// TestMetrics counts a request's routing decision in lanes_requests_total.
func TestMetrics(t *testing.T) {
	f := newFleet(t, "")
	f.start("orders-1 orders")
	f.await("orders", 1)
	reg := prometheus.NewRegistry()
	m, err := lanesmetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	c := f.client(laneshttp.WithMetrics(m))
	for range 2 {
		if code, _ := get(t, lane.WithLane(bg(t), "alice"), c, "http://orders/x"); code != 200 {
			t.Fatal(code)
		}
	}
	want := `
# HELP lanes_requests_total Routed requests by service called, lane requested, lane served and reason (lanestrace's fallback reasons). Lanes past the first 32 and services past the first 128 are counted as "other".
# TYPE lanes_requests_total counter
lanes_requests_total{lane_requested="alice",lane_served="baseline",reason="no_instance_in_lane",service="orders"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "lanes_requests_total"); err != nil {
		t.Fatal(err)
	}
}
