package lanesgrpc_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/lanesdev/lanes/lanesgrpc"
	"github.com/lanesdev/lanes/registry"
)

// checkingRegistry checks, when Serve registers and when it deregisters,
// that the server answers a health check at the instance's address.
type checkingRegistry struct {
	registry.Registry
	t          *testing.T
	registered chan registry.Instance
	answered   chan error // the health check at each Register and lease Close
	lost       chan struct{}
	noClose    bool // no check at Close: the server is known to be down
}

func newCheckingRegistry(t *testing.T, reg registry.Registry) *checkingRegistry {
	return &checkingRegistry{Registry: reg, t: t, registered: make(chan registry.Instance, 1), answered: make(chan error, 2), lost: make(chan struct{})}
}

func (r *checkingRegistry) healthy(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	_, err := healthpb.NewHealthClient(direct(r.t, addr)).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	return err
}

func (r *checkingRegistry) Register(ctx context.Context, inst registry.Instance, ttl time.Duration) (registry.Lease, error) {
	r.answered <- r.healthy(inst.Addr)
	l, err := r.Registry.Register(ctx, inst, ttl)
	if err != nil {
		return nil, err
	}
	r.registered <- l.Instance()
	return &checkingLease{Lease: l, r: r}, nil
}

type checkingLease struct {
	registry.Lease
	r    *checkingRegistry
	once sync.Once
}

func (l *checkingLease) Close() error {
	l.once.Do(func() {
		if !l.r.noClose {
			l.r.answered <- l.r.healthy(l.Instance().Addr)
		}
	})
	return l.Lease.Close()
}

func (l *checkingLease) Done() <-chan struct{} { return l.r.lost }

func newHealthServer(opts ...grpc.ServerOption) *grpc.Server {
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	testpb.RegisterTestServiceServer(srv, &testServer{b: &backend{id: "x"}})
	return srv
}

func TestServe(t *testing.T) {
	m := newMesh(t)
	reg := newCheckingRegistry(t, m.reg)
	guard := lanesgrpc.NewGuard(m.engine)
	srv := newHealthServer(lanesgrpc.ServerOptions(lanesgrpc.WithGuard(guard))...)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"LANES_LANE": "Env-Lane", "LANES_ZONE": "az-env", "LANES_VERSION": "v7", "LANES_LABELS": "team=x"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- lanesgrpc.Serve(ctx, srv, lis, reg, registry.Instance{Service: "orders", Zone: "az-code"},
			lanesgrpc.WithEnv(func(k string) string { return env[k] }), lanesgrpc.WithZone("az-option"), lanesgrpc.WithGuard(guard), lanesgrpc.WithLogger(quiet))
	}()

	if err := <-reg.answered; err != nil {
		t.Fatalf("the server did not answer when Serve registered it: %v", err)
	}
	in := <-reg.registered
	if in.Lane != "env-lane" || in.Zone != "az-code" || in.Version != "v7" || in.Labels["team"] != "x" || in.Labels[registry.LabelPath] != registry.PathSDK {
		t.Fatalf("placed as %+v", in)
	}
	if in.Addr != lis.Addr().String() || !strings.HasPrefix(in.ID, in.Host) {
		t.Fatalf("address %s, id %s", in.Addr, in.ID)
	}
	waitFor(t, "the engine to list it", func() bool { return m.listed("orders", in.ID) })
	// The guard knows its instance: a baseline call is refused.
	_, err = testpb.NewTestServiceClient(direct(t, in.Addr)).UnaryCall(callCtx(t, ""), &testpb.SimpleRequest{})
	expectCode(t, err, codes.FailedPrecondition, `serves lane "env-lane"`)

	cancel()
	if err := <-reg.answered; err != nil {
		t.Fatalf("the server did not answer when Serve deregistered it: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if m.listed("orders", in.ID) {
		waitFor(t, "the engine to forget it", func() bool { return !m.listed("orders", in.ID) })
	}
	if _, err := net.Dial("tcp", in.Addr); err == nil {
		t.Fatal("the listener is still open")
	}
}

func TestServeOptionsBeforeEnv(t *testing.T) {
	reg := registry.NewMemory()
	defer reg.Close()
	lis, err := net.Listen("tcp", ":0") // an unspecified IP: the host's address is advertised
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(lis.Addr().(*net.TCPAddr).Port)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- lanesgrpc.Serve(ctx, newHealthServer(), lis, reg, registry.Instance{ID: "o-1", Service: "orders"},
			lanesgrpc.WithEnv(func(k string) string { return map[string]string{"LANES_LANE": "env", "LANES_ZONE": "az-env"}[k] }),
			lanesgrpc.WithLane("opt"), lanesgrpc.WithZone("az-opt"), lanesgrpc.WithLogger(quiet))
	}()
	w, err := reg.Watch(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var in registry.Instance
	waitFor(t, "the registration", func() bool {
		b, err := w.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range b.Events {
			in = ev.Instance
		}
		return in.ID == "o-1"
	})
	host, p, _ := net.SplitHostPort(in.Addr)
	if in.Lane != "opt" || in.Zone != "az-opt" || p != port || net.ParseIP(host).IsUnspecified() {
		t.Fatalf("placed as %+v", in)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestServeFailures(t *testing.T) {
	t.Run("no_service", func(t *testing.T) {
		lis, _ := net.Listen("tcp", "127.0.0.1:0")
		reg := registry.NewMemory()
		defer reg.Close()
		err := lanesgrpc.Serve(context.Background(), newHealthServer(), lis, reg, registry.Instance{}, lanesgrpc.WithEnv(func(string) string { return "" }))
		if err == nil || !strings.Contains(err.Error(), "service") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("registry_closed", func(t *testing.T) {
		lis, _ := net.Listen("tcp", "127.0.0.1:0")
		reg := registry.NewMemory()
		reg.Close()
		err := lanesgrpc.Serve(context.Background(), newHealthServer(), lis, reg, registry.Instance{Service: "orders"}, lanesgrpc.WithLogger(quiet))
		if err == nil || !strings.Contains(err.Error(), "register orders/") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("registration_lost", func(t *testing.T) {
		m := newMesh(t)
		reg := newCheckingRegistry(t, m.reg)
		lis, _ := net.Listen("tcp", "127.0.0.1:0")
		done := make(chan error, 1)
		go func() {
			done <- lanesgrpc.Serve(context.Background(), newHealthServer(), lis, reg, registry.Instance{ID: "o-1", Service: "orders"}, lanesgrpc.WithLogger(quiet))
		}()
		<-reg.answered
		<-reg.registered
		close(reg.lost)
		<-reg.answered // deregistered
		if err := <-done; err == nil || !strings.Contains(err.Error(), "registration of orders/o-1 lost") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("server_stopped", func(t *testing.T) {
		m := newMesh(t)
		reg := newCheckingRegistry(t, m.reg)
		reg.noClose = true
		srv := newHealthServer()
		lis, _ := net.Listen("tcp", "127.0.0.1:0")
		done := make(chan error, 1)
		go func() {
			done <- lanesgrpc.Serve(context.Background(), srv, lis, reg, registry.Instance{ID: "o-1", Service: "orders"}, lanesgrpc.WithLogger(quiet))
		}()
		<-reg.answered
		<-reg.registered
		srv.Stop()
		if err := <-done; err == nil {
			t.Fatal("Serve returned nil after the server stopped by itself")
		}
		waitFor(t, "the deregistration", func() bool { return !m.listed("orders", "o-1") })
	})
}
