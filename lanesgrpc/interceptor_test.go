package lanesgrpc

import (
	"context"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/lanesdev/lanes/lane"
)

// TestInterceptorAllocations bounds what the interceptors allocate per call,
// besides gRPC itself.
func TestInterceptorAllocations(t *testing.T) {
	si := newServerInterceptor(serverConfig(nil))
	ci := newClientInterceptor(clientConfig([]ClientOption{WithIdempotent("/a.B/Idem")}))
	incoming := func(kv ...string) context.Context {
		kv = append([]string{":authority", "orders", "content-type", "application/grpc", "user-agent", "grpc-go/1.85.0"}, kv...)
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs(kv...))
	}
	bg := context.Background()
	for _, tc := range []struct {
		name   string
		server bool
		ctx    context.Context
		method string
		max    float64
		why    string
	}{
		{"server_baseline", true, incoming(), "/a.B/C", 5, "the carrier interface, the lane's context, the new request key, its value and its context"},
		{"server_baseline_keyed", true, incoming("baggage", "lanes-key=0123456789abcdef"), "/a.B/C", 6,
			"the carrier interface, the copy of baggage, the lane's context, the request key's member, its value and its context"},
		{"server_lane", true, incoming("x-lane", "alice", "baggage", "lane=alice,team=x"), "/a.B/C", 6,
			"the carrier interface, the copies of x-lane and baggage, the lane's context, the OpenTelemetry baggage's context and its state"},
		{"client_baseline", false, bg, "/a.B/C", 0, ""},
		{"client_lane", false, lane.WithLane(bg, "alice"), "/a.B/C", 2,
			"the outgoing context and its value: the metadata of a lane is built once"},
		{"client_lane_with_metadata", false, metadata.AppendToOutgoingContext(lane.WithLane(bg, "alice"), "k", "v"), "/a.B/C", 8,
			"the copy of the metadata, its values, the baggage string, the outgoing context"},
		{"client_idempotent", false, bg, "/a.B/Idem", 2, "the retry state and its context"},
	} {
		f := func() { ci.outgoing(tc.ctx, tc.method) }
		if tc.server {
			f = func() { si.incoming(tc.ctx, tc.method) }
		}
		n := testing.AllocsPerRun(1000, f)
		t.Logf("%s: %.0f allocations", tc.name, n)
		if n > tc.max {
			t.Errorf("%s: %.0f allocations, want at most %.0f (%s)", tc.name, n, tc.max, tc.why)
		}
	}
}
