package lanesgrpc_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/lanesdev/lanes/internal/testkit/benchcpu"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesgrpc"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

type emptyServer struct {
	testpb.UnimplementedTestServiceServer
}

func (emptyServer) EmptyCall(context.Context, *testpb.Empty) (*testpb.Empty, error) {
	return &testpb.Empty{}, nil
}

// BenchmarkUnary compares a unary call (EmptyCall, on one loopback server
// that runs the lanes server interceptors) made through lanes' resolver,
// balancer and client interceptors with the same call through grpc-go's
// round_robin and no interceptor. "lanes_in_lane" carries a lane (which
// falls back to the baseline), so that its interceptors write x-lane and
// baggage.
//
// The lanes sub-benchmarks also report x_round_robin: their time per call
// divided by round_robin's, measured in alternating chunks of calls within
// the same run (round_robin's chunks untimed), so that the ratio holds on a
// loaded machine; and x_round_robin_cpu, the same ratio of the process's CPU
// time, which a loaded machine disturbs least.
//
// "traced/..." are the same calls with tracing on, against plain otelgrpc:
// see benchTracedUnary.
func BenchmarkUnary(b *testing.B) {
	addr := serveEmpty(b, lanesgrpc.ServerOptions()...)

	reg := registry.NewMemory()
	defer reg.Close()
	lease, err := reg.Register(context.Background(), registry.Instance{ID: "bench-1", Service: "bench", Addr: addr}, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer lease.Close()
	engine := routing.New(routing.WithRegistry(reg))
	defer engine.Close()
	creds := grpc.WithTransportCredentials(insecure.NewCredentials())

	r := manual.NewBuilderWithScheme("bench")
	r.InitialState(resolver.State{Endpoints: []resolver.Endpoint{{Addresses: []resolver.Address{{Addr: addr}}}}})
	rrConn, err := grpc.NewClient("bench:///bench", creds, grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
	if err != nil {
		b.Fatal(err)
	}
	defer rrConn.Close()
	rr := testpb.NewTestServiceClient(rrConn)
	lanesConn, err := lanesgrpc.NewClient(engine, "bench", lanesgrpc.WithDialOptions(creds))
	if err != nil {
		b.Fatal(err)
	}
	defer lanesConn.Close()
	lanes := testpb.NewTestServiceClient(lanesConn)
	bg := context.Background()

	b.Run("round_robin", func(b *testing.B) { benchCalls(b, rr, bg, nil) })
	b.Run("lanes", func(b *testing.B) { benchCalls(b, lanes, bg, rr) })
	b.Run("lanes_in_lane", func(b *testing.B) { benchCalls(b, lanes, lane.WithLane(bg, "alice"), rr) })
	// What lanes itself costs: against round_robin calls that carry the
	// same lane metadata, written by hand.
	laneMD := metadata.Pairs("x-lane", "alice", "baggage", "lane=alice")
	b.Run("lanes_in_lane_vs_lane_metadata", func(b *testing.B) {
		benchCalls(b, lanes, lane.WithLane(bg, "alice"), rr, laneMD)
	})
	// The floor of a lane call: what the two lane metadata entries cost
	// gRPC (encoding them, and decoding them on the server, which also
	// copies them for the interceptor), without lanes on the client.
	b.Run("round_robin_with_lane_metadata", func(b *testing.B) {
		benchCalls(b, rr, metadata.NewOutgoingContext(bg, laneMD), rr)
	})
	// With tracing on: lanes against plain otelgrpc (benchTracedUnary).
	b.Run("traced", benchTracedUnary)
}

// benchCalls makes b.N timed calls with client, after one that connects.
// With a reference client, it also makes as many untimed calls with it, in
// alternating chunks, and reports the ratios of the two times per call: wall
// time (x_round_robin) and the process's CPU time (x_round_robin_cpu, which
// a loaded machine disturbs less: client and server run in this process).
//
// refMD, when given, is the outgoing metadata of the reference calls.
func benchCalls(b *testing.B, client testpb.TestServiceClient, ctx context.Context, ref testpb.TestServiceClient, refMD ...metadata.MD) {
	in := &testpb.Empty{}
	call := func(c testpb.TestServiceClient, ctx context.Context) {
		if _, err := c.EmptyCall(ctx, in); err != nil {
			b.Fatal(err)
		}
	}
	call(client, ctx)
	b.ReportAllocs()
	if ref == nil {
		b.ResetTimer()
		for range b.N {
			call(client, ctx)
		}
		return
	}
	refCtx := context.Background() //lanes:ignore the reference calls are plain gRPC calls, without lanes, on purpose
	if len(refMD) > 0 {
		refCtx = metadata.NewOutgoingContext(refCtx, refMD[0])
	}
	call(ref, refCtx)
	b.ResetTimer()
	wall, cpu := benchcpu.Compare(b, 256, func() { call(client, ctx) }, func() { call(ref, refCtx) })
	b.StopTimer()
	b.ReportMetric(wall, "x_round_robin")
	if cpu > 0 {
		b.ReportMetric(cpu, "x_round_robin_cpu")
	}
}

// BenchmarkUnaryLaneMetadata is the floor of a lane call: a round_robin
// call that carries the lane metadata (x-lane and baggage, written by hand)
// against one without it, on a server without interceptors (plain_server:
// what gRPC itself spends on two more metadata entries) and on one with the
// lanes server interceptors (lanes_server: that, plus the server reading a
// lane rather than giving a baseline request its request key). It reports
// x_round_robin and x_round_robin_cpu as BenchmarkUnary does.
func BenchmarkUnaryLaneMetadata(b *testing.B) {
	creds := grpc.WithTransportCredentials(insecure.NewCredentials())
	md := metadata.NewOutgoingContext(context.Background(), metadata.Pairs("x-lane", "alice", "baggage", "lane=alice"))
	for _, tc := range []struct {
		name string
		opts []grpc.ServerOption
	}{
		{"plain_server", nil},
		{"lanes_server", lanesgrpc.ServerOptions()},
	} {
		b.Run(tc.name, func(b *testing.B) {
			conn, err := grpc.NewClient(serveEmpty(b, tc.opts...), creds)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			rr := testpb.NewTestServiceClient(conn)
			benchCalls(b, rr, md, rr)
		})
	}
}

// serveEmpty serves the test service with empty answers on a loopback
// port, with opts, until the benchmark ends, and returns its address.
func serveEmpty(b *testing.B, opts ...grpc.ServerOption) string {
	srv := grpc.NewServer(opts...)
	testpb.RegisterTestServiceServer(srv, emptyServer{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(lis)
	b.Cleanup(srv.Stop)
	return lis.Addr().String()
}
