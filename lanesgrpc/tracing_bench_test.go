package lanesgrpc_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/lanesdev/lanes/internal/testkit/benchcpu"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesgrpc"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// BenchmarkTracedUnary measures what tracing through lanes costs: a unary call traced by lanes
// (client and server spans with the routing decision, on otelgrpc's stats handlers) against the
// same call through grpc-go's round_robin traced by plain otelgrpc (x_otelgrpc, x_otelgrpc_cpu),
// and the untraced lanes call against the untraced round_robin one (x_round_robin). The spans are
// sampled and dropped (no exporter), so the figures are the instrumentation's own.
func BenchmarkTracedUnary(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer tp.Shutdown(context.Background())
	lanesAddr := serveEmpty(b, lanesgrpc.ServerOptions(lanesgrpc.WithTracerProvider(tp))...)
	plainLanesAddr := serveEmpty(b, lanesgrpc.ServerOptions()...)
	otelAddr := serveEmpty(b, grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp))))
	plainAddr := serveEmpty(b)

	reg := registry.NewMemory()
	defer reg.Close()
	for _, in := range []registry.Instance{{ID: "t-1", Service: "traced", Addr: lanesAddr}, {ID: "u-1", Service: "untraced", Addr: plainLanesAddr}} {
		lease, err := reg.Register(context.Background(), in, 0)
		if err != nil {
			b.Fatal(err)
		}
		defer lease.Close()
	}
	engine := routing.New(routing.WithRegistry(reg))
	defer engine.Close()
	creds := grpc.WithTransportCredentials(insecure.NewCredentials())
	rrClient := func(addr string, opts ...grpc.DialOption) testpb.TestServiceClient {
		r := manual.NewBuilderWithScheme("bench")
		r.InitialState(resolver.State{Endpoints: []resolver.Endpoint{{Addresses: []resolver.Address{{Addr: addr}}}}})
		cc, err := grpc.NewClient("bench:///x", append([]grpc.DialOption{creds, grpc.WithResolvers(r),
			grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`)}, opts...)...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cc.Close() })
		return testpb.NewTestServiceClient(cc)
	}
	lanesClient := func(service string, opts ...lanesgrpc.ClientOption) testpb.TestServiceClient {
		cc, err := lanesgrpc.NewClient(engine, service, append([]lanesgrpc.ClientOption{lanesgrpc.WithDialOptions(creds)}, opts...)...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cc.Close() })
		return testpb.NewTestServiceClient(cc)
	}
	otel := rrClient(otelAddr, grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp))))
	plain := rrClient(plainAddr)
	traced := lanesClient("traced", lanesgrpc.WithTracerProvider(tp))
	untraced := lanesClient("untraced")
	bg := context.Background()
	in := &testpb.Empty{}
	compare := func(b *testing.B, c testpb.TestServiceClient, ctx context.Context, ref testpb.TestServiceClient, name string) {
		call := func(c testpb.TestServiceClient, ctx context.Context) {
			if _, err := c.EmptyCall(ctx, in); err != nil {
				b.Fatal(err)
			}
		}
		call(c, ctx)
		call(ref, bg)
		b.ReportAllocs()
		b.ResetTimer()
		wall, cpu := benchcpu.Compare(b, 256, func() { call(c, ctx) }, func() { call(ref, bg) })
		b.StopTimer()
		b.ReportMetric(wall, "x_"+name)
		if cpu > 0 {
			b.ReportMetric(cpu, "x_"+name+"_cpu")
		}
	}
	b.Run("otelgrpc", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, err := otel.EmptyCall(bg, in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("lanes_traced", func(b *testing.B) { compare(b, traced, bg, otel, "otelgrpc") })
	b.Run("lanes_traced_in_lane", func(b *testing.B) { compare(b, traced, lane.WithLane(bg, "alice"), otel, "otelgrpc") })
	b.Run("lanes_untraced", func(b *testing.B) { compare(b, untraced, bg, plain, "round_robin") })
}
