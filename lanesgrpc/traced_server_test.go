package lanesgrpc_test

import (
	"context"
	"net"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesgrpc"
	"github.com/lanesdev/lanes/lanestrace"
)

// The guard of a traced lane instance refuses what an untraced one refuses (unary and streaming
// calls, before the handler), admits the exempt methods, and the server span of a refused call
// says so.
func TestGuardTraced(t *testing.T) {
	m := newMesh(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	alice := m.start("orders", "alice-1", "alice", withServerOptions(lanesgrpc.WithTracerProvider(tp)))
	toAlice := testpb.NewTestServiceClient(direct(t, alice.addr))
	call := func(l string) (*testpb.SimpleResponse, error) {
		ctx := callCtx(t, "")
		if l != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "x-lane", l)
		}
		return toAlice.UnaryCall(ctx, &testpb.SimpleRequest{})
	}

	_, err := call("")
	expectCode(t, err, codes.FailedPrecondition, `serves lane "alice"`, "baseline request")
	_, err = call("bob")
	expectCode(t, err, codes.FailedPrecondition, `serves lane "alice"`, `lane "bob"`)
	resp, err := call("alice")
	if err != nil {
		t.Fatalf("alice request refused: %v", err)
	}
	if resp.Hostname != "alice" {
		t.Errorf("the handler saw lane %q, want alice", resp.Hostname)
	}
	stream, err := toAlice.StreamingOutputCall(callCtx(t, ""), &testpb.StreamingOutputCallRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	expectCode(t, err, codes.FailedPrecondition, `serves lane "alice"`)
	if _, err := healthpb.NewHealthClient(direct(t, alice.addr)).Check(callCtx(t, ""), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health check: %v", err)
	}
	if n := alice.guard.Refused(); n != 3 {
		t.Errorf("refused %d, want 3", n)
	}
	if alice.hits.Load() != 1 {
		t.Errorf("a refused request reached the handler: %d hits", alice.hits.Load())
	}

	waitFor(t, "five server spans", func() bool { return len(rec.Ended()) >= 5 })
	var refused, admitted, exempt int
	for _, s := range rec.Ended() {
		if s.SpanKind() != trace.SpanKindServer {
			continue
		}
		a := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			a[kv.Key] = kv.Value
		}
		if a[lanestrace.InstanceLane].AsString() != "alice" {
			t.Errorf("server span %q: lane.instance.lane %q, want alice", s.Name(), a[lanestrace.InstanceLane].AsString())
		}
		switch {
		case a[lanestrace.GuardExempt].AsBool():
			exempt++
		case a[lanestrace.GuardAdmitted].AsBool():
			admitted++
		default:
			refused++
		}
	}
	if refused != 3 || admitted != 1 || exempt != 1 {
		t.Errorf("server spans: %d refused, %d admitted, %d exempt; want 3, 1, 1", refused, admitted, exempt)
	}
}

// A traced server made with ServerOptions and no guard gives unary and streaming handlers the lane
// of the request, and a baseline request its key.
func TestServerOptionsTracedWithoutGuard(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	seen := make(chan [2]string, 4)
	srv := grpc.NewServer(lanesgrpc.ServerOptions(lanesgrpc.WithTracerProvider(tp))...)
	testpb.RegisterTestServiceServer(srv, laneEcho{seen: seen})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	c := testpb.NewTestServiceClient(direct(t, lis.Addr().String()))

	if _, err := c.EmptyCall(metadata.AppendToOutgoingContext(callCtx(t, ""), "x-lane", "alice"), &testpb.Empty{}); err != nil {
		t.Fatal(err)
	}
	if got := <-seen; got[0] != "alice" || got[1] != "" {
		t.Errorf("unary lane request: handler saw lane %q, key %q; want alice and no key", got[0], got[1])
	}
	if _, err := c.EmptyCall(callCtx(t, ""), &testpb.Empty{}); err != nil {
		t.Fatal(err)
	}
	if got := <-seen; got[0] != "" || got[1] == "" {
		t.Errorf("unary baseline request: handler saw lane %q, key %q; want the baseline and a key", got[0], got[1])
	}
	stream, err := c.StreamingOutputCall(metadata.AppendToOutgoingContext(callCtx(t, ""), "x-lane", "bob"), &testpb.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	if got := <-seen; got[0] != "bob" {
		t.Errorf("streaming lane request: handler saw lane %q, want bob", got[0])
	}
}

// laneEcho reports the lane and request key of each call's context.
type laneEcho struct {
	testpb.UnimplementedTestServiceServer
	seen chan<- [2]string
}

func (e laneEcho) EmptyCall(ctx context.Context, _ *testpb.Empty) (*testpb.Empty, error) {
	e.seen <- [2]string{lane.FromContext(ctx), lane.KeyFromContext(ctx)}
	return &testpb.Empty{}, nil
}

func (e laneEcho) StreamingOutputCall(_ *testpb.StreamingOutputCallRequest, stream grpc.ServerStreamingServer[testpb.StreamingOutputCallResponse]) error {
	e.seen <- [2]string{lane.FromContext(stream.Context()), lane.KeyFromContext(stream.Context())}
	return stream.Send(&testpb.StreamingOutputCallResponse{})
}
