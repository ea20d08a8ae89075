package routing

import (
	"context"

	"github.com/lanesdev/lanes/lane"
)

// WithKey returns ctx carrying the request key that makes canary splits
// sticky (for example a user or session id). Transports read it with
// KeyFromContext when they build a Request, and carry it on to the next hops
// of a baseline request. It is lane.WithKey: the key is normalised with
// lane.NormalizeKey.
func WithKey(ctx context.Context, key string) context.Context {
	return lane.WithKey(ctx, key)
}

// KeyFromContext returns the request key in ctx, or "". It is
// lane.KeyFromContext.
func KeyFromContext(ctx context.Context) string {
	return lane.KeyFromContext(ctx)
}

// RequestFromContext builds the Request of a call made with ctx: its lane
// (lane.FromContext), its key (KeyFromContext), and the caller's zone and
// host (registry.LocalHost). It does not allocate.
func RequestFromContext(ctx context.Context, zone, host string) Request {
	return Request{Lane: lane.FromContext(ctx), Zone: zone, Host: host, Key: KeyFromContext(ctx)}
}
