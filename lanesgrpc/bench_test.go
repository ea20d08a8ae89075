package lanesgrpc_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

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
// round_robin and no interceptor. The lanes sub-benchmarks report their time
// per call as a multiple of round_robin's (x_round_robin), measured in the
// same run. "lanes_in_lane" carries a lane (which falls back to the
// baseline), so its interceptors write x-lane and baggage.
func BenchmarkUnary(b *testing.B) {
	srv := grpc.NewServer(lanesgrpc.ServerOptions()...)
	testpb.RegisterTestServiceServer(srv, emptyServer{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()
	addr := lis.Addr().String()

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

	var rrNs float64
	b.Run("round_robin", func(b *testing.B) {
		r := manual.NewBuilderWithScheme("bench")
		r.InitialState(resolver.State{Endpoints: []resolver.Endpoint{{Addresses: []resolver.Address{{Addr: addr}}}}})
		cc, err := grpc.NewClient("bench:///bench", creds, grpc.WithResolvers(r),
			grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Close()
		rrNs = benchCalls(b, cc, context.Background())
	})
	for _, bc := range []struct {
		name string
		ctx  context.Context
	}{
		{"lanes", context.Background()},
		{"lanes_in_lane", lane.WithLane(context.Background(), "alice")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cc, err := lanesgrpc.NewClient(engine, "bench", lanesgrpc.WithDialOptions(creds))
			if err != nil {
				b.Fatal(err)
			}
			defer cc.Close()
			ns := benchCalls(b, cc, bc.ctx)
			if rrNs > 0 {
				b.ReportMetric(ns/rrNs, "x_round_robin")
			}
		})
	}
}

// benchCalls makes b.N calls on cc, after one that connects, and returns
// the time per call in nanoseconds.
func benchCalls(b *testing.B, cc *grpc.ClientConn, ctx context.Context) float64 {
	client := testpb.NewTestServiceClient(cc)
	in := &testpb.Empty{}
	if _, err := client.EmptyCall(ctx, in); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := client.EmptyCall(ctx, in); err != nil {
			b.Fatal(err)
		}
	}
	return float64(b.Elapsed().Nanoseconds()) / float64(b.N)
}
