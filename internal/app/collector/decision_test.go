package collector

import (
	"testing"

	"go.opentelemetry.io/otel/attribute"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/lanesdev/lanes/lanestrace"
)

// A client span's decision leaves out lane.requested and lane.fallback_reason at their reader's
// values (lanestrace.Decision.Attributes): the collector reads a baseline call that the baseline
// served, four attributes, as the lanes span it is, with the baseline requested and reason none,
// as it reads the same decision written whole.
func TestDecisionDefaults(t *testing.T) {
	d := lanestrace.Decision{Service: "orders", Reason: lanestrace.ReasonNone, Instance: "orders-1", Addr: "127.0.0.1:1", Eligible: 2}
	short := d.Attributes()
	if len(short) != 4 {
		t.Fatalf("a baseline decision served by the baseline has %d attributes, want 4: %v", len(short), short)
	}
	whole := append(short, lanestrace.Requested.String(""), lanestrace.FallbackReason.String(lanestrace.ReasonNone))
	c := converter{max: 1024}
	var got [2]*Span
	for i, kvs := range [][]*commonpb.KeyValue{toKV(short), toKV(whole)} {
		got[i] = c.convert(&tracepb.Span{TraceId: make([]byte, 16), SpanId: make([]byte, 8), Kind: tracepb.Span_SPAN_KIND_CLIENT, Attributes: kvs}, "web")
	}
	for i, s := range got {
		if !s.HasLane || s.Requested != "" || s.FallbackReason != lanestrace.ReasonNone || s.Callee != "orders" || s.InstanceID != "orders-1" || s.Eligible != 2 {
			t.Errorf("decision %d read as %+v", i, s)
		}
	}
	lane := lanestrace.Decision{Service: "orders", Requested: "alice", Reason: lanestrace.ReasonNoInstanceInLane, Instance: "orders-1", Addr: "127.0.0.1:1", Eligible: 2}
	if s := c.convert(&tracepb.Span{TraceId: make([]byte, 16), SpanId: make([]byte, 8), Kind: tracepb.Span_SPAN_KIND_CLIENT, Attributes: toKV(lane.Attributes())}, "web"); s.Requested != "alice" || s.FallbackReason != lanestrace.ReasonNoInstanceInLane {
		t.Errorf("a fallback read as %+v", s)
	}
	// A span of the user's own, without lanes' attributes, stays one.
	if s := c.convert(&tracepb.Span{TraceId: make([]byte, 16), SpanId: make([]byte, 8)}, "web"); s.HasLane || s.FallbackReason != "" {
		t.Errorf("a span without lanes attributes read as %+v", s)
	}
}

// toKV writes span attributes as OTLP does (strings and integers, all a decision has).
func toKV(kvs []attribute.KeyValue) []*commonpb.KeyValue {
	out := make([]*commonpb.KeyValue, 0, len(kvs))
	for _, kv := range kvs {
		v := &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: kv.Value.AsString()}}
		if kv.Value.Type() == attribute.INT64 {
			v = &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: kv.Value.AsInt64()}}
		}
		out = append(out, &commonpb.KeyValue{Key: string(kv.Key), Value: v})
	}
	return out
}
