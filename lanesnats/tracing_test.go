package lanesnats_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/internal/testkit/natstest"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesnats"
	"github.com/lanesdev/lanes/lanestrace"
)

// TestTracing: a message published in lane alice and consumed by the baseline consumer (alice has
// none) shows the producer's span and the consumer's in one trace, the consumer's with the reason.
func TestTracing(t *testing.T) {
	e := newEnv(t, natstest.Embedded(t), "")
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	pub, err := lanesnats.NewPublisher(e.js, e.topic, lanesnats.WithPublisherTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	r := newRecorder()
	var handlerSpan trace.SpanContext
	e.consumer("billing-1", "", lanesnats.HandlerFunc(func(ctx context.Context, d *lanesnats.Delivery) error {
		handlerSpan = trace.SpanContextFromContext(ctx)
		return r.handler("billing-1").HandleMessage(ctx, d)
	}), lanesnats.WithConsumerTracerProvider(tp))
	if _, err := pub.Publish(lane.WithLane(context.Background(), "alice"), "created", []byte("x")); err != nil {
		t.Fatal(err)
	}
	r.wait(t, 1, 30*time.Second)
	waitFor(t, 30*time.Second, "two spans", func() bool { return len(rec.Ended()) >= 2 })
	var prod, cons sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.SpanKind() {
		case trace.SpanKindProducer:
			prod = s
		case trace.SpanKindConsumer:
			cons = s
		}
	}
	if prod == nil || cons == nil {
		t.Fatalf("spans %v", rec.Ended())
	}
	if cons.SpanContext().TraceID() != prod.SpanContext().TraceID() || cons.Parent().SpanID() != prod.SpanContext().SpanID() {
		t.Errorf("the consumer's span is not the producer's child")
	}
	if handlerSpan.SpanID() != cons.SpanContext().SpanID() {
		t.Errorf("the handler's context does not carry the consumer's span")
	}
	attrs := map[attribute.Key]attribute.Value{}
	for _, kv := range cons.Attributes() {
		attrs[kv.Key] = kv.Value
	}
	for k, want := range map[attribute.Key]string{
		lanestrace.Requested: "alice", lanestrace.ConsumerLane: "", lanestrace.Served: "",
		lanestrace.FallbackReason: lanestrace.ReasonNoInstanceInLane, lanestrace.InstanceID: "billing-1",
	} {
		if got := attrs[k].AsString(); got != want {
			t.Errorf("consumer span %s = %q, want %q", k, got, want)
		}
	}
	if attrs[lanestrace.DeliveryCount].AsInt64() != 1 {
		t.Errorf("delivery count %v", attrs[lanestrace.DeliveryCount])
	}
	for _, kv := range prod.Attributes() {
		if kv.Key == lanestrace.Requested && kv.Value.AsString() != "alice" {
			t.Errorf("producer span lane %q", kv.Value.AsString())
		}
	}
}
