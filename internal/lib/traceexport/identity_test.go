package traceexport

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestIdentified: spans exported before the process registers an instance keep the program's
// name; afterwards they carry the instance's service and lane, the first instance's.
func TestIdentified(t *testing.T) {
	identity.Store(nil) // the process's identity, as at start
	t.Cleanup(func() { identity.Store(nil) })
	mem := tracetest.NewInMemoryExporter()
	res, err := Resource("bin")
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(Identified(mem)), sdktrace.WithResource(res))
	defer tp.Shutdown(context.Background())
	span := func() map[attribute.Key]string {
		_, s := tp.Tracer("t").Start(context.Background(), "s")
		s.End()
		got := mem.GetSpans()
		out := map[attribute.Key]string{}
		for _, kv := range got[len(got)-1].Resource.Attributes() {
			out[kv.Key] = kv.Value.AsString()
		}
		return out
	}
	if got := span(); got[semconv.ServiceNameKey] != "bin" {
		t.Fatalf("before: %v", got)
	}
	Identify(semconv.ServiceName("shipping"), attribute.String("lane.instance.lane", "alice"))
	Identify(semconv.ServiceName("other"))
	if got := span(); got[semconv.ServiceNameKey] != "shipping" || got["lane.instance.lane"] != "alice" {
		t.Fatalf("after: %v", got)
	}
}
