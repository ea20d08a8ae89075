package gateway

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/lanesdev/lanes/routing"
)

func TestH2C(t *testing.T) { onStacks(t, testH2C) }

func testH2C(t *testing.T) {
	w := newWorld(t, "", Config{})
	twoLanes(t, w)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr, Timeout: waitFor}
	r := do(t, c, http.MethodGet, w.url+"/", map[string]string{"x-lane": "alice"})
	if r.proto != "HTTP/2.0" {
		t.Fatalf("the gateway answered with %s, want HTTP/2.0", r.proto)
	}
	expectServed(t, r, "alice-1", "alice")
	// Upstream, plain HTTP/1.1 with keep-alive.
	if r.echo.Proto != "HTTP/1.1" {
		t.Errorf("upstream protocol %s, want HTTP/1.1", r.echo.Proto)
	}
	// An HTTP/1.1 client on the same port.
	if r := w.get(t, "/", nil); r.proto != "HTTP/1.1" {
		t.Errorf("HTTP/1.1 client answered with %s", r.proto)
	}
}

// grpcBackend is a gRPC server with the health service. Every unary call
// gets trailers naming the backend and the lane its metadata carried.
type grpcBackend struct {
	id, lane, addr string
	srv            *grpc.Server
	health         *health.Server
	unavailable    atomic.Bool // answer every call with Unavailable
}

func newGRPCBackend(t testing.TB, id, ln string) *grpcBackend {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &grpcBackend{id: id, lane: ln, addr: l.Addr().String(), health: health.NewServer()}
	b.srv = grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if b.unavailable.Load() {
			return nil, status.Error(codes.Unavailable, "down")
		}
		md, _ := metadata.FromIncomingContext(ctx)
		got := strings.Join(md.Get("x-lane"), ",")
		grpc.SetHeader(ctx, metadata.Pairs("x-backend", id))
		grpc.SetTrailer(ctx, metadata.Pairs("x-backend-id", id, "x-lane-seen", got, "x-baggage-seen", strings.Join(md.Get("baggage"), ",")))
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(b.srv, b.health)
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.srv.Serve(l)
	}()
	t.Cleanup(func() {
		b.srv.Stop()
		<-done
	})
	return b
}

func grpcClient(t testing.TB, addr string) healthpb.HealthClient {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return healthpb.NewHealthClient(cc)
}

func TestGRPCPassThrough(t *testing.T) { onStacks(t, testGRPCPassThrough) }

func testGRPCPassThrough(t *testing.T) {
	w := newWorld(t, "", Config{Routes: []Route{
		{Prefix: "/grpc.health.v1.Health/", Service: "health"},
		{Prefix: "/", Service: "orders"},
	}})
	base := newGRPCBackend(t, "hbase", "")
	alice := newGRPCBackend(t, "halice", "alice")
	alice.health.SetServingStatus("orders", healthpb.HealthCheckResponse_NOT_SERVING)
	w.register(t, "health", base.id, base.addr, "")
	w.register(t, "health", alice.id, alice.addr, "alice")
	hc := grpcClient(t, w.addr)
	ctx := context.Background()

	var hdr, tr metadata.MD
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr), grpc.Trailer(&tr))
	if err != nil {
		t.Fatalf("Check through the gateway: %v", err)
	}
	if resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("status %v", resp.Status)
	}
	if got := tr.Get("x-backend-id"); len(got) != 1 || got[0] != "hbase" {
		t.Errorf("trailer x-backend-id = %q, want hbase", got)
	}
	if got := tr.Get("x-lane-seen"); len(got) != 1 || got[0] != "" {
		t.Errorf("baseline call: backend saw x-lane %q", got)
	}
	if got := hdr.Get("x-lane-served"); len(got) != 1 || got[0] != "baseline" {
		t.Errorf("header x-lane-served = %q, want baseline", got)
	}

	// A lane call: the lane travels in metadata and in baggage.
	lctx := metadata.AppendToOutgoingContext(ctx, "x-lane", "alice", "baggage", "k=v")
	hdr, tr = nil, nil
	_, err = hc.Check(lctx, &healthpb.HealthCheckRequest{Service: "orders"}, grpc.Header(&hdr), grpc.Trailer(&tr))
	if err != nil {
		t.Fatalf("lane Check: %v", err)
	}
	if got := tr.Get("x-backend-id"); len(got) != 1 || got[0] != "halice" {
		t.Errorf("lane call served by %q, want halice", got)
	}
	if got := tr.Get("x-lane-seen"); len(got) != 1 || got[0] != "alice" {
		t.Errorf("backend saw x-lane %q, want alice", got)
	}
	if got := tr.Get("x-baggage-seen"); len(got) != 1 || got[0] != "lane=alice,k=v" {
		t.Errorf("backend saw baggage %q", got)
	}
	if got := hdr.Get("x-lane"); len(got) != 1 || got[0] != "alice" {
		t.Errorf("header x-lane = %q, want alice", got)
	}

	// A gRPC error status passes through with its trailers.
	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "unknown"}, grpc.Trailer(&tr))
	if status.Code(err) != codes.NotFound {
		t.Errorf("unknown service: %v, want NotFound", err)
	}
	if got := tr.Get("x-backend-id"); len(got) != 1 {
		t.Errorf("the trailers of an error did not come through: %v", tr)
	}

	// A server stream.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := stream.Recv(); err != nil || m.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Watch: %v, %v", m, err)
	}
	base.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	if m, err := stream.Recv(); err != nil || m.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Watch after a change: %v, %v", m, err)
	}
	cancel()
}

func TestGRPCErrors(t *testing.T) { onStacks(t, testGRPCErrors) }

func testGRPCErrors(t *testing.T) {
	w := newWorld(t, "", Config{Routes: []Route{{Prefix: "/grpc.health.v1.Health/", Service: "health"}}})
	alice := newGRPCBackend(t, "halice", "alice")
	w.register(t, "health", alice.id, alice.addr, "alice")
	hc := grpcClient(t, w.addr)
	ctx := context.Background()

	var tr metadata.MD // a trailers-only answer: its headers are trailers
	_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&tr))
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "no_instance") {
		t.Errorf("baseline call with no baseline instance: %v, want Unavailable naming no_instance", err)
	}
	if got := tr.Get("x-lanes-error"); len(got) != 1 || got[0] != "no_instance" {
		t.Errorf("x-lanes-error = %q", got)
	}
	_, err = hc.Check(metadata.AppendToOutgoingContext(ctx, "x-lane", "Not_Valid"), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), `rule "characters"`) {
		t.Errorf("invalid lane: %v, want InvalidArgument naming the rule", err)
	}
	cc, err := grpc.NewClient("passthrough:///"+w.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	err = cc.Invoke(ctx, "/other.Service/Method", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("unknown route: %v, want Unimplemented", err)
	}
}

func TestGRPCUnavailableEjects(t *testing.T) { onStacks(t, testGRPCUnavailableEjects) }

func testGRPCUnavailableEjects(t *testing.T) {
	w := newWorld(t, "outlier: {errors: 2, window: 1m, ejection: 10m}\n", Config{Routes: []Route{{Prefix: "/", Service: "health"}}})
	good := newGRPCBackend(t, "good", "")
	bad := newGRPCBackend(t, "bad", "")
	bad.unavailable.Store(true)
	w.register(t, "health", good.id, good.addr, "")
	w.register(t, "health", bad.id, bad.addr, "")
	hc := grpcClient(t, w.addr)
	fails := 0
	for range 10 {
		if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); status.Code(err) == codes.Unavailable {
			fails++
		}
	}
	if fails < 2 || fails > 3 {
		t.Errorf("%d calls failed with Unavailable; want the instance ejected after 2", fails)
	}
	for range 10 {
		if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("after the ejection: %v", err)
		}
	}
}

// TestGRPCRefusedMovesOn: a gRPC call whose instance refuses the connection
// moves on to another instance within the same call, its body intact, and
// the refusing instance is ejected.
func TestGRPCRefusedMovesOn(t *testing.T) { onStacks(t, testGRPCRefusedMovesOn) }

func testGRPCRefusedMovesOn(t *testing.T) {
	w := newWorld(t, "outlier: {errors: 1000, window: 1m, ejection: 10m}\n", Config{Routes: []Route{{Prefix: "/", Service: "health"}}})
	good := newGRPCBackend(t, "good", "")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	w.register(t, "health", good.id, good.addr, "")
	w.register(t, "health", "dead", dead, "")
	hc := grpcClient(t, w.addr)
	for i := range 10 {
		if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if d, _ := w.engine.Service("health").Resolve(routing.Request{}); len(d.Eligible) != 1 || d.Eligible[0] != good.id {
		t.Fatalf("eligible %v, want %s alone", d.Eligible, good.id)
	}
}

// TestGRPCToHTTP1Only: a gRPC call routed to an instance that speaks
// HTTP/1 only fails with Unavailable naming the service and saying so, is
// counted (x-lanes-error upstream_http1), and does not count against the
// instance: it is never ejected.
func TestGRPCToHTTP1Only(t *testing.T) { onStacks(t, testGRPCToHTTP1Only) }

func testGRPCToHTTP1Only(t *testing.T) {
	w := newWorld(t, "outlier: {errors: 2, window: 1m, ejection: 10m}\n", Config{Routes: []Route{{Prefix: "/", Service: "hello"}}})
	h1 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") }))
	t.Cleanup(h1.Close)
	good := newGRPCBackend(t, "good", "")
	w.register(t, "hello", "hello-1", h1.Listener.Addr().String(), "")
	w.register(t, "hello", good.id, good.addr, "")
	hc := grpcClient(t, w.addr)
	const want = 4 // twice the outlier threshold
	fails := 0
	for i := 0; fails < want; i++ {
		if i == 200 {
			t.Fatalf("%d of %d calls reached the HTTP/1-only instance; want %d", fails, i, want)
		}
		var tr metadata.MD
		_, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Trailer(&tr))
		if err == nil {
			continue
		}
		fails++
		msg := status.Convert(err).Message()
		if status.Code(err) != codes.Unavailable || !strings.Contains(msg, `service "hello"`) || !strings.Contains(msg, "HTTP/1 only") {
			t.Fatalf("call %d: %v; want Unavailable naming service hello and HTTP/1 only", i, err)
		}
		if got := tr.Get("x-lanes-error"); len(got) != 1 || got[0] != codeHTTP1Only {
			t.Errorf("call %d: x-lanes-error = %q, want %s", i, got, codeHTTP1Only)
		}
	}
	if n := testutil.ToFloat64(w.gw.m.errorsV.WithLabelValues(codeHTTP1Only)); n != want {
		t.Errorf("lanes_gateway_errors_total{code=%s} = %v, want %d", codeHTTP1Only, n, want)
	}
	if d, _ := w.engine.Service("hello").Resolve(routing.Request{}); len(d.Eligible) != 2 {
		t.Errorf("eligible %v after %d HTTP/1 answers: the HTTP/1-only instance was ejected", d.Eligible, want)
	}
	// Its HTTP/1.1 traffic goes on.
	resp, err := http.Get("http://" + w.addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("HTTP/1.1 GET: %d %q, want 200", resp.StatusCode, body)
	}
}
