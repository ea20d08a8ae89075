package lanestrace

import (
	"sync/atomic"

	"go.opentelemetry.io/otel/trace"
)

// provider is the tracer provider the transports use when they are given none; nil when tracing
// is off (the default), so that an untraced call costs nothing.
var provider atomic.Pointer[trace.TracerProvider]

// SetTracerProvider makes tp the tracer provider of the transports of lanes (laneshttp, lanesgrpc,
// lanesnats) that are created afterwards without one of their own; nil turns their tracing off.
// FromEnv calls it.
func SetTracerProvider(tp trace.TracerProvider) {
	if tp == nil {
		provider.Store(nil)
		return
	}
	provider.Store(&tp)
}

// TracerProvider returns the provider SetTracerProvider set, or nil when tracing is off.
func TracerProvider() trace.TracerProvider {
	if p := provider.Load(); p != nil {
		return *p
	}
	return nil
}

// ScopeName is the instrumentation scope of the spans lanes writes.
const ScopeName = "github.com/lanesdev/lanes"

// Tracer returns the tracer of lanes' spans from tp, or from TracerProvider when tp is nil; nil
// when tracing is off.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = TracerProvider()
	}
	if tp == nil {
		return nil
	}
	return tp.Tracer(ScopeName)
}
