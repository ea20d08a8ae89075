package lanesgrpc_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesgrpc"
	"github.com/lanesdev/lanes/lanesmetrics"
	"github.com/lanesdev/lanes/lanestrace"
)

// spanAttrs returns the attributes of the first span of kind k, or fails.
func spanAttrs(t *testing.T, rec *tracetest.SpanRecorder, k trace.SpanKind) map[attribute.Key]attribute.Value {
	t.Helper()
	for _, s := range rec.Ended() {
		if s.SpanKind() == k {
			out := map[attribute.Key]attribute.Value{}
			for _, kv := range s.Attributes() {
				out[kv.Key] = kv.Value
			}
			return out
		}
	}
	t.Fatalf("no %s span among %d", k, len(rec.Ended()))
	return nil
}

// TestTracing traces a lane call that falls back to the baseline: otelgrpc's client span carries
// the routing decision, its server span the lane received and the instance's own lane, in one
// trace.
func TestTracing(t *testing.T) {
	m := newMesh(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })

	b := m.start("orders", "orders-1", "", withServerOptions(lanesgrpc.WithTracerProvider(tp)))
	m.start("orders", "orders-bob", "bob")
	c := m.client("orders", lanesgrpc.WithTracerProvider(tp))
	if _, err := c.UnaryCall(callCtx(t, "alice"), &testpb.SimpleRequest{}); err != nil {
		t.Fatal(err)
	}
	_ = b
	waitFor(t, "two spans", func() bool { return len(rec.Ended()) >= 2 })
	cl := spanAttrs(t, rec, trace.SpanKindClient)
	for k, want := range map[attribute.Key]string{
		lanestrace.Service: "orders", lanestrace.Requested: "alice", lanestrace.Served: "",
		lanestrace.FallbackReason: lanestrace.ReasonNoInstanceInLane, lanestrace.InstanceID: "orders-1",
		lanestrace.InstanceAddr: b.addr,
	} {
		if got := cl[k].AsString(); got != want {
			t.Errorf("client span %s = %q, want %q", k, got, want)
		}
	}
	if cl[lanestrace.Eligible].AsInt64() != 1 || cl[lanestrace.Retries].AsInt64() != 0 {
		t.Errorf("client span eligible %v, retries %v", cl[lanestrace.Eligible], cl[lanestrace.Retries])
	}
	sv := spanAttrs(t, rec, trace.SpanKindServer)
	if sv[lanestrace.Requested].AsString() != "alice" || sv[lanestrace.InstanceLane].AsString() != "" || !sv[lanestrace.GuardAdmitted].AsBool() {
		t.Errorf("server span %v", sv)
	}
	var ids []trace.TraceID
	for _, s := range rec.Ended() {
		ids = append(ids, s.SpanContext().TraceID())
	}
	if len(ids) < 2 || ids[0] != ids[1] {
		t.Errorf("client and server spans in different traces: %v", ids)
	}
}

// TestMetrics counts a call's routing decision in lanes_requests_total.
func TestMetrics(t *testing.T) {
	m := newMesh(t)
	m.start("orders", "orders-1", "")
	reg := prometheus.NewRegistry()
	counter, err := lanesmetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	c := m.client("orders", lanesgrpc.WithMetrics(counter))
	for range 3 {
		if _, err := c.UnaryCall(callCtx(t, "alice"), &testpb.SimpleRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.ToFloat64(counterVec(t, reg)); got != 3 {
		t.Fatalf("lanes_requests_total = %v, want 3", got)
	}
}

// counterVec returns the one lanes_requests_total series of reg, checking its labels.
func counterVec(t *testing.T, reg *prometheus.Registry) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v, %v", mfs, err)
	}
	labels := map[string]string{}
	for _, lp := range mfs[0].GetMetric()[0].GetLabel() {
		labels[lp.GetName()] = lp.GetValue()
	}
	if labels["service"] != "orders" || labels["lane_requested"] != "alice" || labels["lane_served"] != "baseline" || labels["reason"] != "no_instance_in_lane" {
		t.Fatalf("labels %v", labels)
	}
	return reg
}

// Each call's client span counts its own attempts: the calls that share a pooled attempt timer
// (a context that cannot be cancelled) do not add up each other's.
func TestTracingRetriesPerCall(t *testing.T) {
	m := newMesh(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	m.start("orders", "orders-1", "", withServerOptions(lanesgrpc.WithTracerProvider(tp)))
	c := m.client("orders", lanesgrpc.WithTracerProvider(tp))
	ctx := lane.WithLane(context.Background(), "alice") // no Done: the attempt timer is pooled; the response-header timeout bounds each call
	for range 5 {
		if _, err := c.UnaryCall(ctx, &testpb.SimpleRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "ten spans", func() bool { return len(rec.Ended()) >= 10 })
	for _, s := range rec.Ended() {
		if s.SpanKind() != trace.SpanKindClient {
			continue
		}
		for _, kv := range s.Attributes() {
			if kv.Key == lanestrace.Retries && kv.Value.AsInt64() != 0 {
				t.Errorf("a call without retries has lane.retries %d", kv.Value.AsInt64())
			}
		}
	}
}
