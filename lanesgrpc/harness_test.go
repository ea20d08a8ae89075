package lanesgrpc_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/lanesdev/lanes/internal/testkit/timing"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesgrpc"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// quiet is the logger of the instances the tests run.
var quiet = slog.New(slog.DiscardHandler)

// patience bounds every wait of these tests. It is generous: the tests run
// on loaded machines and under -race, and measure nothing.
const patience = 30 * time.Second

// waitFor polls cond until it holds, or fails the test after patience.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	timing.Until(t, what, patience, cond)
}

// callCtx is the context of one test call: a lane (if any) and a deadline.
func callCtx(t testing.TB, l string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	t.Cleanup(cancel)
	if l != "" {
		ctx = lane.WithLane(ctx, l)
	}
	return ctx
}

// mesh is a fleet on loopback: an in-memory registry and policy store, and
// one engine that every test process shares.
type mesh struct {
	t      *testing.T
	reg    *registry.Memory
	store  *policy.Memory
	engine *routing.Engine
}

func newMesh(t *testing.T) *mesh {
	t.Helper()
	m := &mesh{t: t, reg: registry.NewMemory(), store: policy.NewMemory()}
	m.engine = routing.New(routing.WithRegistry(m.reg), routing.WithPolicyStore(m.store))
	t.Cleanup(func() {
		m.engine.Close()
		m.reg.Close()
	})
	<-m.engine.PolicyReady()
	return m
}

// setPolicy puts doc in force and waits until the engine follows it.
func (m *mesh) setPolicy(doc string) {
	m.t.Helper()
	d, err := m.store.Put(context.Background(), []byte(doc))
	if err != nil {
		m.t.Fatal(err)
	}
	waitFor(m.t, "the policy", func() bool { return m.engine.Policy() == d.Policy })
}

// client returns a lanes client of service.
func (m *mesh) client(service string, opts ...lanesgrpc.ClientOption) testpb.TestServiceClient {
	m.t.Helper()
	opts = append([]lanesgrpc.ClientOption{lanesgrpc.WithDialOptions(grpc.WithTransportCredentials(insecure.NewCredentials()))}, opts...)
	cc, err := lanesgrpc.NewClient(m.engine, service, opts...)
	if err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() { cc.Close() })
	return testpb.NewTestServiceClient(cc)
}

// backend is one instance of a test service, served by Serve.
type backend struct {
	id, service, lane string
	addr              string
	guard             *lanesgrpc.Guard
	srv               *grpc.Server
	health            *health.Server

	hits    atomic.Int64
	fail    atomic.Bool // answer Unavailable
	onUnary atomic.Pointer[func(ctx context.Context) error]
	next    testpb.TestServiceClient // the service it calls, if any
	invalid atomic.Int64             // invalid lanes seen by its interceptors

	mu  sync.Mutex
	mds []metadata.MD // incoming metadata, per request

	cancel context.CancelFunc
	done   chan error
}

type backendOpt func(*backendConfig)

type backendConfig struct {
	next     testpb.TestServiceClient
	serveOps []lanesgrpc.ServerOption
	srvOps   []lanesgrpc.ServerOption
	noGuard  bool
}

func withNext(c testpb.TestServiceClient) backendOpt {
	return func(b *backendConfig) { b.next = c }
}

func withServeOptions(opts ...lanesgrpc.ServerOption) backendOpt {
	return func(b *backendConfig) { b.serveOps = append(b.serveOps, opts...) }
}

// withServerOptions adds options to the server (NewServer).
func withServerOptions(opts ...lanesgrpc.ServerOption) backendOpt {
	return func(b *backendConfig) { b.srvOps = append(b.srvOps, opts...) }
}

func withoutGuard() backendOpt { return func(b *backendConfig) { b.noGuard = true } }

// start runs an instance of service in lane l (baseline for "") with Serve,
// the lanes server interceptors and a guard, and waits until the engine
// lists it.
func (m *mesh) start(service, id, l string, opts ...backendOpt) *backend {
	m.t.Helper()
	var bc backendConfig
	for _, o := range opts {
		o(&bc)
	}
	b := &backend{id: id, service: service, lane: l, next: bc.next, done: make(chan error, 1), health: health.NewServer()}
	sopts := []lanesgrpc.ServerOption{lanesgrpc.WithLogger(quiet), lanesgrpc.WithInvalidLaneHandler(func(context.Context, string, *lane.NameError) { b.invalid.Add(1) })}
	if !bc.noGuard {
		b.guard = lanesgrpc.NewGuard(m.engine)
		sopts = append(sopts, lanesgrpc.WithGuard(b.guard))
	}
	b.srv = lanesgrpc.NewServer(append(sopts, bc.srvOps...)...) // Serve finds the guard
	testpb.RegisterTestServiceServer(b.srv, &testServer{b: b})
	healthpb.RegisterHealthServer(b.srv, b.health)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		m.t.Fatal(err)
	}
	b.addr = lis.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	serveOpts := append([]lanesgrpc.ServerOption{
		lanesgrpc.WithLane(l),
		lanesgrpc.WithEnv(func(string) string { return "" }),
		lanesgrpc.WithShutdownTimeout(patience),
		lanesgrpc.WithLogger(quiet),
	}, bc.serveOps...)
	go func() {
		b.done <- lanesgrpc.Serve(ctx, b.srv, lis, m.reg, registry.Instance{ID: id, Service: service}, serveOpts...)
	}()
	m.t.Cleanup(b.stop)
	waitFor(m.t, "the engine to list "+id, func() bool { return m.listed(service, id) })
	return b
}

// listed reports whether the engine lists instance id of service.
func (m *mesh) listed(service, id string) bool {
	for _, in := range m.engine.Service(service).Instances() {
		if in.ID == id {
			return true
		}
	}
	return false
}

// stop shuts the instance down through Serve's context; it is idempotent.
func (b *backend) stop() {
	if b.cancel == nil {
		return
	}
	b.cancel()
	<-b.done
	b.cancel = nil
}

func (b *backend) record(ctx context.Context) {
	b.hits.Add(1)
	md, _ := metadata.FromIncomingContext(ctx)
	b.mu.Lock()
	b.mds = append(b.mds, md)
	b.mu.Unlock()
}

// lastMD returns the incoming metadata of the last request.
func (b *backend) lastMD() metadata.MD {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.mds) == 0 {
		return nil
	}
	return b.mds[len(b.mds)-1]
}

// testServer answers with the path of instance ids the call took
// ("front-1>alice-1") in ServerId, and the lane each hop saw in Hostname
// ("|alice").
type testServer struct {
	testpb.UnimplementedTestServiceServer
	b *backend
}

func (s *testServer) EmptyCall(ctx context.Context, _ *testpb.Empty) (*testpb.Empty, error) {
	s.b.record(ctx)
	return &testpb.Empty{}, nil
}

func (s *testServer) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	s.b.record(ctx)
	if f := s.b.onUnary.Load(); f != nil {
		if err := (*f)(ctx); err != nil {
			return nil, err
		}
	}
	if s.b.fail.Load() {
		return nil, status.Error(codes.Unavailable, s.b.id+" is failing")
	}
	path, lanes := s.b.id, lane.FromContext(ctx)
	if s.b.next != nil {
		resp, err := s.b.next.UnaryCall(forward(ctx), req)
		if err != nil {
			return nil, err
		}
		path += ">" + resp.ServerId
		lanes += "|" + resp.Hostname
	}
	return &testpb.SimpleResponse{ServerId: path, Hostname: lanes}, nil
}

func (s *testServer) StreamingOutputCall(req *testpb.StreamingOutputCallRequest, stream grpc.ServerStreamingServer[testpb.StreamingOutputCallResponse]) error {
	ctx := stream.Context()
	s.b.record(ctx)
	prefix := s.b.id + "(" + lane.FromContext(ctx) + ")"
	if s.b.next == nil {
		for range 2 {
			if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: []byte(prefix)}}); err != nil {
				return err
			}
		}
		return nil
	}
	down, err := s.b.next.StreamingOutputCall(forward(ctx), req)
	if err != nil {
		return err
	}
	for {
		msg, err := down.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		body := prefix + ">" + string(msg.GetPayload().GetBody())
		if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: []byte(body)}}); err != nil {
			return err
		}
	}
}

// forward copies the incoming metadata to the outgoing context, as many
// services do, so that the test sees what the client interceptor makes of
// stale lane keys.
func forward(ctx context.Context) context.Context {
	md, _ := metadata.FromIncomingContext(ctx)
	out := metadata.MD{}
	for k, v := range md {
		if k == lane.Header || k == lane.BaggageHeader || strings.HasPrefix(k, "x-test") {
			out[k] = v
		}
	}
	return metadata.NewOutgoingContext(ctx, out)
}

// servedBy makes one unary call in lane l and returns the path it took, or
// the error.
func servedBy(t testing.TB, c testpb.TestServiceClient, l string) (string, error) {
	t.Helper()
	resp, err := c.UnaryCall(callCtx(t, l), &testpb.SimpleRequest{})
	if err != nil {
		return "", err
	}
	return resp.ServerId, nil
}

// mustServe makes one call in lane l and returns the path.
func mustServe(t testing.TB, c testpb.TestServiceClient, l string) string {
	t.Helper()
	path, err := servedBy(t, c, l)
	if err != nil {
		t.Fatalf("call in lane %q: %v", l, err)
	}
	return path
}
