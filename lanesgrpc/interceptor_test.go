package lanesgrpc

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

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

// BenchmarkInterceptors measures what the interceptors cost per call,
// besides gRPC itself: the server's reading of the lane from the incoming
// metadata, and the client's writing of it.
func BenchmarkInterceptors(b *testing.B) {
	si := newServerInterceptor(serverConfig(nil))
	ci := newClientInterceptor(clientConfig(nil))
	incoming := func(kv ...string) context.Context {
		kv = append([]string{":authority", "orders", "content-type", "application/grpc", "user-agent", "grpc-go/1.85.0"}, kv...)
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs(kv...))
	}
	bg := context.Background()
	base, inLane := incoming(), incoming("x-lane", "alice", "baggage", "lane=alice")
	laneCtx := lane.WithLane(bg, "alice")
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"server_baseline", func() { si.incoming(base, "/a.B/C") }},
		{"server_lane", func() { si.incoming(inLane, "/a.B/C") }},
		{"client_baseline", func() { ci.outgoing(bg, "/a.B/C") }},
		{"client_lane", func() { ci.outgoing(laneCtx, "/a.B/C") }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				tc.f()
			}
		})
	}
}

// TestTimedCallAfterFunc checks that gRPC's context for a call, derived
// with context.WithCancel from the attempt's timed context, is cancelled by
// the timeout without a goroutine of its own, and that a timed context
// whose registration is stopped is reused.
func TestTimedCallAfterFunc(t *testing.T) {
	bg := context.Background()

	tc := startTimed(bg, time.Hour)
	before := runtime.NumGoroutine()
	_, cancel := context.WithCancel(tc)
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("context.WithCancel started %d goroutines", n-before)
	}
	cancel() // gRPC's call ends: the registration is stopped
	if tc.end() {
		t.Error("end reports a fired timeout")
	}
	if tc.Context != nil {
		t.Error("a timed context whose registration was stopped is not reused")
	}

	tc = startTimed(bg, time.Millisecond)
	first, cancel1 := context.WithCancel(tc)
	defer cancel1()
	second, cancel2 := context.WithCancel(tc) // a second registration
	defer cancel2()
	for _, c := range []context.Context{first, second} {
		select {
		case <-c.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the timeout did not cancel the derived context")
		}
		if !errors.Is(c.Err(), context.Canceled) {
			t.Errorf("derived context: %v, want context.Canceled", c.Err())
		}
	}
	if !tc.end() {
		t.Error("end does not report the fired timeout")
	}
	// Registered after the timeout fired: cancelled at once.
	late, cancel3 := context.WithCancel(tc)
	defer cancel3()
	if late.Err() == nil {
		t.Error("a context derived after the timeout is not cancelled")
	}
}
