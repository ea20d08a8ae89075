package lane

import "context"

// ctxKey is the context key of the lane. Being an unexported type, no other
// package can read or overwrite the value behind it.
type ctxKey struct{}

// WithLane returns a copy of ctx that carries the lane name.
//
// name must be normalised: "" for the baseline, or a value that [Valid]
// accepts, as returned by [Parse] or [Propagator.Extract]. WithLane does not
// check it; [Propagator.Inject] normalises what it writes and treats an
// invalid name as the baseline.
//
// The empty name is stored too, not skipped: a request that a hop decided to
// serve as baseline explicitly clears a lane set further up the context.
func WithLane(ctx context.Context, name string) context.Context {
	if v, ok := ctx.Value(ctxKey{}).(string); ok && v == name {
		return ctx
	}
	return context.WithValue(ctx, ctxKey{}, name)
}

// FromContext returns the lane stored in ctx by [WithLane], or "" (the
// baseline) when there is none. It does not allocate.
func FromContext(ctx context.Context) string {
	name, _ := ctx.Value(ctxKey{}).(string)
	return name
}

// Detach returns a context for work that outlives the request, such as a
// goroutine started by a handler. It keeps the lane and every other value of
// ctx (so the OpenTelemetry span and baggage too) but not its cancellation
// or deadline: it is [context.WithoutCancel].
//
//	func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
//		bg := lane.Detach(r.Context())
//		go s.audit.Record(bg, r.URL.Path) // still routed in the request's lane
//		...
//	}
//
// Give detached work its own timeout, for example with
// [context.WithTimeout] on the returned context.
func Detach(ctx context.Context) context.Context {
	return context.WithoutCancel(ctx)
}
