package routing

import (
	"context"

	"github.com/lanesdev/lanes/lane"
)

// RequestFromContext builds the Request of a call made with ctx: its lane
// (lane.FromContext), its key (lane.KeyFromContext: the key that makes
// canary splits sticky, set with lane.WithKey), and the caller's zone and
// host (registry.LocalHost). It does not allocate.
func RequestFromContext(ctx context.Context, zone, host string) Request {
	return Request{Lane: lane.FromContext(ctx), Zone: zone, Host: host, Key: lane.KeyFromContext(ctx)}
}
