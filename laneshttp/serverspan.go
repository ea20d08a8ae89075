package laneshttp

import (
	"context"
	"sync/atomic"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// One server span per request. The lanes middleware traces a request with
// otelhttp's server span when tracing is on; an application that traces its
// handler with otelhttp too would add a second, sibling one. So:
//
//   - a request whose context already carries a recording span (an otelhttp
//     handler around the middleware) is traced on that span: the middleware
//     starts none and records its decision there;
//   - the handler inside sees lanes' span through a tracer provider that
//     hands the first server span started under the request (an otelhttp
//     handler inside, which takes its tracer from the span of the context
//     unless given a provider) lanes' span itself, renamed and enriched,
//     instead of a new one.

// sharedKey marks the context of a request that lanes traces.
type sharedKey struct{}

// sharedSpan is lanes' server span of one request, until an inner server
// span takes it.
type sharedSpan struct {
	span  trace.Span // lanes' (otelhttp's) span, ended by lanes
	taken atomic.Bool
}

// shareSpan returns ctx, which carries lanes' server span, with that span
// offered to the first server span started under it.
func shareSpan(ctx context.Context) context.Context {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return ctx
	}
	s := &sharedSpan{span: span}
	ctx = context.WithValue(ctx, sharedKey{}, s)
	return trace.ContextWithSpan(ctx, offeringSpan{Span: span, tp: offeringProvider{inner: span.TracerProvider()}})
}

// offeringSpan is lanes' span as the handler sees it: its tracer provider
// offers it to the first server span started under the request.
type offeringSpan struct {
	trace.Span
	tp offeringProvider
}

func (s offeringSpan) TracerProvider() trace.TracerProvider { return s.tp }

type offeringProvider struct {
	embedded.TracerProvider
	inner trace.TracerProvider
}

func (p offeringProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return offeringTracer{inner: p.inner.Tracer(name, opts...), tp: p}
}

type offeringTracer struct {
	embedded.Tracer
	inner trace.Tracer
	tp    offeringProvider
}

func (t offeringTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	s, _ := ctx.Value(sharedKey{}).(*sharedSpan)
	if s == nil {
		return t.inner.Start(ctx, name, opts...)
	}
	cfg := trace.NewSpanStartConfig(opts...)
	if cfg.SpanKind() != trace.SpanKindServer || !s.taken.CompareAndSwap(false, true) {
		return t.inner.Start(ctx, name, opts...)
	}
	s.span.SetName(name)
	s.span.SetAttributes(cfg.Attributes()...)
	inner := innerSpan{offeringSpan{Span: s.span, tp: t.tp}}
	return trace.ContextWithSpan(ctx, inner), inner
}

// innerSpan is lanes' span as an inner server span: lanes ends it.
type innerSpan struct{ offeringSpan }

func (innerSpan) End(...trace.SpanEndOption) {}
