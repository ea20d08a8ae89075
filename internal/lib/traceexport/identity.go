package traceexport

import (
	"context"
	"errors"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// identity is the resource of the first instance this process registered (Identify): the
// exporters of Identified name its spans after it.
var identity atomic.Pointer[resource.Resource]

// Identify records attrs (the service name and lane of an instance the transports' Serve
// registered) as the identity of this process's spans. The first call wins: a process that
// registers several instances is named after the first.
func Identify(attrs ...attribute.KeyValue) {
	identity.CompareAndSwap(nil, resource.NewSchemaless(attrs...))
}

// Identified returns exp, exporting each span with its resource updated by the identity of the
// process (Identify), once it has one; until then as it is.
func Identified(exp sdktrace.SpanExporter) sdktrace.SpanExporter {
	return &identified{SpanExporter: exp}
}

type identified struct {
	sdktrace.SpanExporter
	last atomic.Pointer[merged] // the spans of a provider share one resource
}

type merged struct{ from, id, res *resource.Resource }

func (e *identified) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	id := identity.Load()
	if id == nil || len(spans) == 0 {
		return e.SpanExporter.ExportSpans(ctx, spans)
	}
	out := make([]sdktrace.ReadOnlySpan, len(spans))
	for i, s := range spans {
		out[i] = identifiedSpan{ReadOnlySpan: s, res: e.resource(s.Resource(), id)}
	}
	return e.SpanExporter.ExportSpans(ctx, out)
}

// resource returns from updated by id.
func (e *identified) resource(from, id *resource.Resource) *resource.Resource {
	if m := e.last.Load(); m != nil && m.from == from && m.id == id {
		return m.res
	}
	res, err := resource.Merge(from, id)
	if err != nil && !errors.Is(err, resource.ErrSchemaURLConflict) {
		return from
	}
	e.last.Store(&merged{from: from, id: id, res: res})
	return res
}

// identifiedSpan is a span with the process's identity as its resource.
type identifiedSpan struct {
	sdktrace.ReadOnlySpan
	res *resource.Resource
}

func (s identifiedSpan) Resource() *resource.Resource { return s.res }
