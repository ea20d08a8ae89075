package lane

import (
	"context"

	"go.opentelemetry.io/otel/baggage"
)

// WithLane returns a copy of ctx that carries the lane name.
//
// name must be normalised: "" for the baseline, or a value that [Valid]
// accepts, as returned by [Parse] or [Propagator.Extract]. WithLane does not
// check it; [Propagator.Inject] normalises what it writes and treats an
// invalid name as the baseline.
//
// The baseline clears a lane set further up the context: a request that a
// hop decided to serve as baseline is a baseline request from there on. The
// request key of ctx ([KeyFromContext]) is kept.
//
// The OpenTelemetry baggage of the copy (go.opentelemetry.io/otel/baggage)
// agrees with it: its member "lane" is name, or absent for the baseline, and
// its other members are kept. So OpenTelemetry's propagators, which write
// the baggage of the context whole, carry the same lane as lanes' headers,
// whichever runs last. A baseline context without baggage gets none.
//
// It does not allocate for a context that carries no request key and the
// baseline or a lane of the fleet (see [Encode]), beyond the context itself.
func WithLane(ctx context.Context, name string) context.Context {
	bag := baggage.FromContext(ctx)
	cur := Carry(ctx)
	ctx = store(ctx, cur, cur.with(name, cur.member))
	if bag.Len() == 0 && name == "" {
		return ctx
	}
	return syncBaggage(ctx, bag, name)
}

// FromContext returns the lane stored in ctx by [WithLane], or "" (the
// baseline) when there is none. It does not allocate.
func FromContext(ctx context.Context) string {
	return Carry(ctx).name
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
