package lanesgrpc_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
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

// parallelCallers is how many calls the -parallel cases of benchTracedUnary make at once.
const parallelCallers = 8

// benchTracedUnary is BenchmarkUnary's "traced" cases: what tracing through lanes costs. A unary
// call traced by lanes (otelgrpc's client and server spans, with the routing decision and the
// server's side of the hop) against the same call through grpc-go's round_robin traced by plain
// otelgrpc, client and server. Both sides propagate the trace context (W3C traceparent), as a
// traced fleet does: otelgrpc's default propagator is OpenTelemetry's global one, which writes
// nothing until a program sets one. The spans are sampled and dropped (no exporter), so the
// figures are the instrumentation's own.
//
//   - plain-otel, lanes-traced, lanes-traced-lane: each alone, for its allocations;
//   - cpu-vs-plain-otel/lanes-traced: a baseline call against the plain otelgrpc call, in
//     alternating chunks (x_otelgrpc: wall time; x_otelgrpc_cpu: the process's CPU time, which a
//     loaded machine disturbs least);
//   - cpu-vs-plain-otel/lanes-traced-lane: a call in lane alice (which falls back to the
//     baseline) against the plain otelgrpc call;
//   - cpu-vs-plain-otel-with-lane-metadata/lanes-traced-lane: the same against a plain otelgrpc
//     call that carries the same lane metadata, written by hand: what lanes itself costs;
//   - cpu-vs-round-robin/lanes-untraced: the untraced lanes call against the untraced
//     round_robin one, on the same servers' untraced twins;
//   - cpu-vs-plain-otel/lanes-traced-no-header-timeout: the baseline call with the
//     response-header timeout off, against the plain otelgrpc call: what the timeout costs;
//   - cpu-vs-plain-otel-no-retry/lanes-traced-no-retry: both with gRPC's retry off
//     (grpc.WithDisableRetry): what grpc-go's retry path costs either;
//   - cpu-vs-plain-otel/plain-otel-again: a second plain otelgrpc client and server, the same
//     as the first, against it: the spread and bias of the measurement itself (ideally 1.0);
//   - cpu-vs-plain-otel-parallel/...: the baseline call, the lane call and the control again,
//     with parallelCallers calls at once on each side (benchcpu.CompareParallel), so that both
//     cores are busy and neither side's figure depends on how often the scheduler parks and
//     wakes a thread between two calls; cpu-vs-plain-otel-parallel-with-lane-metadata is the
//     lane call against otelgrpc carrying the same lane metadata.
func benchTracedUnary(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer tp.Shutdown(context.Background())
	tc := otelgrpc.WithPropagators(propagation.TraceContext{})
	lanesAddr := serveEmpty(b, lanesgrpc.ServerOptions(lanesgrpc.WithTracerProvider(tp))...)
	plainLanesAddr := serveEmpty(b, lanesgrpc.ServerOptions()...)
	otelAddr := serveEmpty(b, grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp), tc)))
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
	otel := rrClient(otelAddr, grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp), tc)))
	plain := rrClient(plainAddr)
	traced := lanesClient("traced", lanesgrpc.WithTracerProvider(tp))
	untraced := lanesClient("untraced")
	bg := context.Background()
	inLane := lane.WithLane(bg, "alice")
	laneMD := metadata.NewOutgoingContext(bg, metadata.Pairs("x-lane", "alice", "baggage", "lane=alice")) //lanes:ignore the reference calls are plain gRPC calls, without lanes, on purpose
	in := &testpb.Empty{}
	call := func(b *testing.B, c testpb.TestServiceClient, ctx context.Context) {
		if _, err := c.EmptyCall(ctx, in); err != nil {
			b.Fatal(err)
		}
	}
	callMany := func(b *testing.B, c testpb.TestServiceClient, ctx context.Context) { // from any goroutine
		if _, err := c.EmptyCall(ctx, in); err != nil {
			b.Error(err)
		}
	}
	alone := func(c testpb.TestServiceClient, ctx context.Context) func(*testing.B) {
		return func(b *testing.B) {
			call(b, c, ctx)
			b.ReportAllocs()
			for b.Loop() {
				call(b, c, ctx)
			}
		}
	}
	// compareAt compares c's calls with ref's, par at once (0: one at a time).
	compareAt := func(par int, c testpb.TestServiceClient, ctx context.Context, ref testpb.TestServiceClient, refCtx context.Context, name string) func(*testing.B) {
		return func(b *testing.B) {
			call(b, c, ctx)
			call(b, ref, refCtx)
			b.ReportAllocs()
			b.ResetTimer()
			var wall, cpu float64
			if par == 0 {
				wall, cpu = benchcpu.Compare(b, 256, func() { call(b, c, ctx) }, func() { call(b, ref, refCtx) })
			} else {
				wall, cpu = benchcpu.CompareParallel(b, 256, par, func() { callMany(b, c, ctx) }, func() { callMany(b, ref, refCtx) })
			}
			b.StopTimer()
			b.ReportMetric(wall, "x_"+name)
			if cpu > 0 {
				b.ReportMetric(cpu, "x_"+name+"_cpu")
			}
		}
	}
	compare := func(c testpb.TestServiceClient, ctx context.Context, ref testpb.TestServiceClient, refCtx context.Context, name string) func(*testing.B) {
		return compareAt(0, c, ctx, ref, refCtx, name)
	}
	b.Run("plain-otel", alone(otel, bg))
	b.Run("lanes-traced", alone(traced, bg))
	b.Run("lanes-traced-lane", alone(traced, inLane))
	b.Run("cpu-vs-plain-otel/lanes-traced", compare(traced, bg, otel, bg, "otelgrpc"))
	b.Run("cpu-vs-plain-otel/lanes-traced-lane", compare(traced, inLane, otel, bg, "otelgrpc"))
	b.Run("cpu-vs-plain-otel-with-lane-metadata/lanes-traced-lane", compare(traced, inLane, otel, laneMD, "otelgrpc"))
	b.Run("cpu-vs-round-robin/lanes-untraced", compare(untraced, bg, plain, bg, "round_robin"))
	noTimeout := lanesClient("traced", lanesgrpc.WithTracerProvider(tp), lanesgrpc.WithResponseHeaderTimeout(-1))
	b.Run("cpu-vs-plain-otel/lanes-traced-no-header-timeout", compare(noTimeout, bg, otel, bg, "otelgrpc"))
	noRetry := lanesClient("traced", lanesgrpc.WithTracerProvider(tp), lanesgrpc.WithDialOptions(grpc.WithDisableRetry()))
	otelNoRetry := rrClient(otelAddr, grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp), tc)), grpc.WithDisableRetry())
	b.Run("cpu-vs-plain-otel-no-retry/lanes-traced-no-retry", compare(noRetry, bg, otelNoRetry, bg, "otelgrpc"))
	otelAgain := rrClient(serveEmpty(b, grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp), tc))),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp), tc)))
	b.Run("cpu-vs-plain-otel/plain-otel-again", compare(otelAgain, bg, otel, bg, "otelgrpc"))
	b.Run("cpu-vs-plain-otel-parallel/lanes-traced", compareAt(parallelCallers, traced, bg, otel, bg, "otelgrpc"))
	b.Run("cpu-vs-plain-otel-parallel/lanes-traced-lane", compareAt(parallelCallers, traced, inLane, otel, bg, "otelgrpc"))
	b.Run("cpu-vs-plain-otel-parallel-with-lane-metadata/lanes-traced-lane", compareAt(parallelCallers, traced, inLane, otel, laneMD, "otelgrpc"))
	b.Run("cpu-vs-plain-otel-parallel/plain-otel-again", compareAt(parallelCallers, otelAgain, bg, otel, bg, "otelgrpc"))
}
