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
	return RequestOf(lane.Carry(ctx), zone, host)
}

// RequestOf is RequestFromContext for a transport that has read what the
// call's context carries already (lane.Carry): its lane and key, read once
// for the pick and the headers of the call.
func RequestOf(v *lane.Carried, zone, host string) Request {
	return Request{Lane: v.Lane(), Zone: zone, Host: host, Key: v.Key()}
}
