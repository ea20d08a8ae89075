package lanestrace

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/lane"
)

// LogHandler wraps h so that every record logged with a context carries the request's lane
// (lane), trace id (trace_id) and span id (span_id), where the context has them: a user finds
// every log line of one request by its trace id.
//
//	slog.SetDefault(slog.New(lanestrace.LogHandler(slog.NewJSONHandler(os.Stderr, nil))))
//	slog.InfoContext(r.Context(), "order placed", "order", id)
func LogHandler(h slog.Handler) slog.Handler {
	if _, ok := h.(logHandler); ok {
		return h
	}
	return logHandler{h}
}

type logHandler struct{ slog.Handler }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if ctx != nil {
		if l := lane.FromContext(ctx); l != "" {
			r.AddAttrs(slog.String("lane", l))
		}
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return logHandler{h.Handler.WithAttrs(attrs)}
}

func (h logHandler) WithGroup(name string) slog.Handler { return logHandler{h.Handler.WithGroup(name)} }
