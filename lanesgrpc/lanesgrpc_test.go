package lanesgrpc_test

import (
	"context"
	"io"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/lanesdev/lanes/internal/testkit/timing"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesgrpc"
	"github.com/lanesdev/lanes/routing"
)

// expectCode checks that err is a status with code c whose message contains
// every one of parts.
func expectCode(t *testing.T, err error, c codes.Code, parts ...string) {
	t.Helper()
	st := status.Convert(err)
	if err == nil || st.Code() != c {
		t.Fatalf("got %v, want code %s", err, c)
	}
	for _, p := range parts {
		if !strings.Contains(st.Message(), p) {
			t.Fatalf("message %q does not contain %q", st.Message(), p)
		}
	}
}

// direct returns a plain gRPC client of one address: no lanes routing, no
// lanes interceptors.
func direct(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// withMD returns a call context carrying raw outgoing metadata.
func withMD(t *testing.T, l string, kv ...string) context.Context {
	return metadata.AppendToOutgoingContext(callCtx(t, l), kv...)
}

func TestRouting(t *testing.T) {
	m := newMesh(t)
	m.setPolicy("lanes:\n  bob: {fallback: [team-a]}\n  solo: {strict: true}\n")
	m.start("orders", "base-1", "")
	m.start("orders", "alice-1", "alice")
	m.start("orders", "team-a-1", "team-a")
	m.start("stock", "stock-alice", "alice")
	orders := m.client("orders")

	for _, tc := range []struct{ name, lane, want string }{
		{"baseline", "", "base-1"},
		{"lane", "alice", "alice-1"},
		{"lane_not_normalised", "Alice", "alice-1"},
		{"fallback", "bob", "team-a-1"},
		{"unknown_lane", "zed", "base-1"},
		{"invalid_lane", "not a lane!", "base-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 5 {
				if got := mustServe(t, orders, tc.lane); got != tc.want {
					t.Fatalf("lane %q served by %s, want %s", tc.lane, got, tc.want)
				}
			}
		})
	}
	t.Run("strict", func(t *testing.T) {
		_, err := servedBy(t, orders, "solo")
		expectCode(t, err, codes.Unavailable, "lanes: lane_unavailable", `"orders"`, `"solo"`)
	})
	t.Run("no_instance", func(t *testing.T) {
		stock := m.client("stock")
		_, err := servedBy(t, stock, "")
		expectCode(t, err, codes.Unavailable, "lanes: no_instance", `"stock"`, "baseline")
		_, err = servedBy(t, stock, "zed")
		expectCode(t, err, codes.Unavailable, "lanes: no_instance", `"stock"`, `"zed"`)
		if got := mustServe(t, stock, "alice"); got != "stock-alice" {
			t.Fatalf("alice served by %s", got)
		}
	})
}

func TestIsolation(t *testing.T) {
	m := newMesh(t)
	b1 := m.start("orders", "base-1", "")
	b2 := m.start("orders", "base-2", "")
	alice := m.start("orders", "alice-1", "alice", withoutGuard()) // nothing but routing protects it
	orders := m.client("orders")

	for range 40 {
		if got := mustServe(t, orders, ""); got == "alice-1" {
			t.Fatal("a baseline request reached the lane instance")
		}
	}
	b1.stop()
	b2.stop()
	waitFor(t, "the baseline to leave", func() bool { return !m.listed("orders", "base-1") && !m.listed("orders", "base-2") })
	for range 10 {
		_, err := servedBy(t, orders, "")
		expectCode(t, err, codes.Unavailable, "no_instance")
	}
	if n := alice.hits.Load(); n != 0 {
		t.Fatalf("the lane instance got %d baseline requests", n)
	}
	if got := mustServe(t, orders, "alice"); got != "alice-1" {
		t.Fatalf("alice served by %s", got)
	}
}

func TestPropagationTwoHops(t *testing.T) {
	m := newMesh(t)
	m.start("orders", "orders-b", "")
	oa := m.start("orders", "orders-alice", "alice")
	m.start("front", "front-1", "", withNext(m.client("orders")))
	front := m.client("front")

	t.Run("unary", func(t *testing.T) {
		ctx := withMD(t, "alice", "baggage", "team=x")
		resp, err := front.UnaryCall(ctx, &testpb.SimpleRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if resp.ServerId != "front-1>orders-alice" || resp.Hostname != "alice|alice" {
			t.Fatalf("path %s, lanes %s", resp.ServerId, resp.Hostname)
		}
		md := oa.lastMD()
		if got := md.Get(lane.Header); !slices.Equal(got, []string{"alice"}) {
			t.Fatalf("second hop x-lane %q", got)
		}
		if got := md.Get(lane.BaggageHeader); !slices.Equal(got, []string{"lane=alice,team=x"}) {
			t.Fatalf("second hop baggage %q", got)
		}
	})
	t.Run("server_streaming", func(t *testing.T) {
		stream, err := front.StreamingOutputCall(callCtx(t, "alice"), &testpb.StreamingOutputCallRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			msg, err := stream.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, string(msg.GetPayload().GetBody()))
		}
		want := []string{"front-1(alice)>orders-alice(alice)", "front-1(alice)>orders-alice(alice)"}
		if !slices.Equal(got, want) {
			t.Fatalf("stream %q, want %q", got, want)
		}
	})
	t.Run("baseline", func(t *testing.T) {
		resp, err := front.UnaryCall(callCtx(t, ""), &testpb.SimpleRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if resp.ServerId != "front-1>orders-b" || resp.Hostname != "|" {
			t.Fatalf("path %s, lanes %q", resp.ServerId, resp.Hostname)
		}
	})
}

func TestStaleLaneKeysRemoved(t *testing.T) {
	m := newMesh(t)
	ob := m.start("orders", "orders-b", "")
	oa := m.start("orders", "orders-alice", "alice")
	fr := m.start("front", "front-1", "", withNext(m.client("orders")))

	t.Run("baseline_call", func(t *testing.T) {
		// Metadata copied from some incoming request; the call itself is a
		// baseline call.
		ctx := withMD(t, "", "x-lane", "alice", "baggage", "lane=alice,team=x")
		resp, err := m.client("orders").UnaryCall(ctx, &testpb.SimpleRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if resp.ServerId != "orders-b" {
			t.Fatalf("served by %s", resp.ServerId)
		}
		md := ob.lastMD()
		if got := md.Get(lane.Header); got != nil {
			t.Fatalf("stale x-lane %q reached the server", got)
		}
		if got := md.Get(lane.BaggageHeader); !slices.Equal(got, []string{"team=x"}) {
			t.Fatalf("baggage %q, want [team=x]", got)
		}
	})
	t.Run("invalid_lane_at_a_hop", func(t *testing.T) {
		// A plain client sends an invalid lane to front, which serves the
		// request as baseline, counts it, and forwards its metadata.
		plain := testpb.NewTestServiceClient(direct(t, fr.addr))
		ctx := metadata.AppendToOutgoingContext(callCtx(t, ""), "x-lane", "Not_A_Lane!", "baggage", "team=x")
		resp, err := plain.UnaryCall(ctx, &testpb.SimpleRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if resp.ServerId != "front-1>orders-b" {
			t.Fatalf("path %s", resp.ServerId)
		}
		if fr.invalid.Load() != 1 {
			t.Fatalf("front counted %d invalid lanes, want 1", fr.invalid.Load())
		}
		md := ob.lastMD()
		if got := md.Get(lane.Header); got != nil {
			t.Fatalf("the invalid lane travelled on: x-lane %q", got)
		}
		// front, the entry of this baseline request, gave it a request key.
		if got := md.Get(lane.BaggageHeader); len(got) != 1 || !regexp.MustCompile(`^lanes-key=[0-9a-f]{16},team=x$`).MatchString(got[0]) {
			t.Fatalf("baggage %q, want [lanes-key=<key>,team=x]", got)
		}
	})
	if n := oa.hits.Load(); n != 0 {
		t.Fatalf("the alice instance got %d requests", n)
	}
}

func TestCanaryLaneTravels(t *testing.T) {
	m := newMesh(t)
	m.setPolicy("canary:\n  - service: orders\n    lane: canary\n    percent: 100\n")
	m.start("stock", "stock-b", "")
	m.start("stock", "stock-c", "canary")
	stock := m.client("stock")
	m.start("orders", "orders-b", "", withNext(stock))
	oc := m.start("orders", "orders-c", "canary", withNext(stock))
	orders := m.client("orders")

	for range 5 {
		resp, err := orders.UnaryCall(withMD(t, "", "baggage", "team=x"), &testpb.SimpleRequest{})
		if err != nil {
			t.Fatal(err)
		}
		// The split happened at the first hop; the canary lane travelled
		// to the second, whose service has no canary rule.
		if resp.ServerId != "orders-c>stock-c" || resp.Hostname != "canary|canary" {
			t.Fatalf("path %s, lanes %q", resp.ServerId, resp.Hostname)
		}
	}
	md := oc.lastMD()
	if got := md.Get(lane.Header); !slices.Equal(got, []string{"canary"}) {
		t.Fatalf("x-lane at the canary instance: %q", got)
	}
	if got := md.Get(lane.BaggageHeader); !slices.Contains(got, "lane=canary") || !slices.Contains(got, "team=x") {
		t.Fatalf("baggage at the canary instance: %q", got)
	}
	// A stock call of its own, without the lane, stays in the baseline.
	if got := mustServe(t, stock, ""); got != "stock-b" {
		t.Fatalf("baseline stock call served by %s", got)
	}
}

func TestOutlierEjectionAndRecovery(t *testing.T) {
	m := newMesh(t)
	m.setPolicy("outlier:\n  errors: 3\n  window: 5m\n  ejection: 1s\n")
	a := m.start("orders", "a", "")
	m.start("orders", "b", "")
	orders := m.client("orders")

	a.fail.Store(true)
	failures := 0
	waitFor(t, "three failures on a", func() bool {
		if _, err := servedBy(t, orders, ""); err != nil {
			expectCode(t, err, codes.Unavailable, "a is failing")
			failures++
		}
		return failures >= 3
	})
	// Ejected: a run of calls all served by b. (A half-open probe may fail
	// in between once the ejection has run out; the run then starts again.)
	streak := 0
	waitFor(t, "ten calls in a row served by b", func() bool {
		if got, err := servedBy(t, orders, ""); err == nil && got == "b" {
			streak++
		} else {
			streak = 0
		}
		return streak >= 10
	})
	// Recovery: once a answers again, a probe restores it.
	a.fail.Store(false)
	waitFor(t, "a to serve again", func() bool {
		got, err := servedBy(t, orders, "")
		return err == nil && got == "a"
	})
	seen := map[string]bool{}
	for range 10 {
		seen[mustServe(t, orders, "")] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Fatalf("after recovery, served by %v", seen)
	}
}

// killOnFirstCall makes b's server stop hard while it handles its first
// UnaryCall: the caller sees a connection error on a call that the server
// had received.
func killOnFirstCall(b *backend) {
	var once atomic.Bool
	f := func(ctx context.Context) error {
		if once.CompareAndSwap(false, true) {
			go b.srv.Stop()
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}
	b.onUnary.Store(&f)
}

func TestRetryIdempotent(t *testing.T) {
	m := newMesh(t)
	a := m.start("orders", "a", "")
	m.start("orders", "b", "")
	orders := m.client("orders", lanesgrpc.WithIdempotent("/grpc.testing.TestService/UnaryCall"))
	killOnFirstCall(a)

	calls := 0
	waitFor(t, "a call to reach a", func() bool {
		calls++
		if got := mustServe(t, orders, ""); got != "b" && a.hits.Load() > 0 {
			t.Fatalf("served by %s after a was killed", got)
		}
		return a.hits.Load() > 0
	})
	if a.hits.Load() != 1 {
		t.Fatalf("a got %d calls", a.hits.Load())
	}
	t.Logf("a was killed by call %d, which b served on the retry", calls)
	for range 5 {
		if got := mustServe(t, orders, ""); got != "b" {
			t.Fatalf("served by %s", got)
		}
	}
}

func TestNoRetryNonIdempotent(t *testing.T) {
	m := newMesh(t)
	a := m.start("orders", "a", "")
	b := m.start("orders", "b", "")
	orders := m.client("orders", lanesgrpc.WithIdempotent("/grpc.testing.TestService/EmptyCall"))
	killOnFirstCall(a)

	var failed error
	waitFor(t, "a call to reach a", func() bool {
		before := b.hits.Load()
		_, err := servedBy(t, orders, "")
		if err != nil {
			failed = err
			if b.hits.Load() != before {
				t.Fatal("the failed call was sent to b too")
			}
		}
		return a.hits.Load() > 0
	})
	expectCode(t, failed, codes.Unavailable)
	if a.hits.Load() != 1 {
		t.Fatalf("a got %d calls", a.hits.Load())
	}
}

func TestGuard(t *testing.T) {
	m := newMesh(t)
	m.setPolicy("lanes:\n  bob: {fallback: [team-a]}\n")
	alice := m.start("orders", "alice-1", "alice")
	team := m.start("orders", "team-a-1", "team-a")
	toAlice := testpb.NewTestServiceClient(direct(t, alice.addr))
	toTeam := testpb.NewTestServiceClient(direct(t, team.addr))
	call := func(c testpb.TestServiceClient, l string) error {
		ctx := callCtx(t, "")
		if l != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "x-lane", l)
		}
		_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
		return err
	}

	expectCode(t, call(toAlice, ""), codes.FailedPrecondition, `serves lane "alice"`, "baseline request")
	expectCode(t, call(toAlice, "bob"), codes.FailedPrecondition, `serves lane "alice"`, `lane "bob"`)
	if err := call(toAlice, "alice"); err != nil {
		t.Fatalf("alice request refused: %v", err)
	}
	if err := call(toTeam, "bob"); err != nil {
		t.Fatalf("bob's chain reaches team-a, but: %v", err)
	}
	if n := alice.guard.Refused(); n != 2 {
		t.Fatalf("refused %d, want 2", n)
	}
	if alice.hits.Load() != 1 {
		t.Fatalf("a refused request reached the handler: %d hits", alice.hits.Load())
	}

	t.Run("health_exempt", func(t *testing.T) {
		resp, err := healthpb.NewHealthClient(direct(t, alice.addr)).Check(callCtx(t, ""), &healthpb.HealthCheckRequest{})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health check: %v %v", resp, err)
		}
	})
	t.Run("configured_exemption", func(t *testing.T) {
		// Exempt methods add to the defaults: the health service stays
		// exempt.
		x := m.start("orders", "alice-2", "alice", withServerOptions(lanesgrpc.WithExemptMethods("/grpc.testing.TestService/EmptyCall")))
		c := testpb.NewTestServiceClient(direct(t, x.addr))
		if _, err := c.EmptyCall(callCtx(t, ""), &testpb.Empty{}); err != nil {
			t.Fatal(err)
		}
		if _, err := healthpb.NewHealthClient(direct(t, x.addr)).Check(callCtx(t, ""), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("health check: %v", err)
		}
		expectCode(t, call(c, ""), codes.FailedPrecondition, `"alice"`)
	})
	t.Run("streaming", func(t *testing.T) {
		stream, err := toAlice.StreamingOutputCall(callCtx(t, ""), &testpb.StreamingOutputCallRequest{})
		if err == nil {
			_, err = stream.Recv()
		}
		expectCode(t, err, codes.FailedPrecondition, `serves lane "alice"`)
	})
	t.Run("off", func(t *testing.T) {
		alice.guard.SetEnabled(false)
		defer alice.guard.SetEnabled(true)
		if err := call(toAlice, ""); err != nil {
			t.Fatalf("guard off, but: %v", err)
		}
	})
	t.Run("tag_rule_moves_the_lane", func(t *testing.T) {
		// A dynamic tag rule puts the instance in lane bob: the guard
		// follows the effective lane.
		m.setPolicy("tags:\n  - service: orders\n    lane: bob\n    addrs: [\"" + alice.addr + "\"]\n")
		expectCode(t, call(toAlice, "alice"), codes.FailedPrecondition, `serves lane "bob"`)
		if err := call(toAlice, "bob"); err != nil {
			t.Fatal(err)
		}
	})
}

func TestNewLaneInstanceTakesTraffic(t *testing.T) {
	m := newMesh(t)
	m.start("orders", "base-1", "")
	orders := m.client("orders")
	if got := mustServe(t, orders, "alice"); got != "base-1" {
		t.Fatalf("served by %s", got)
	}
	m.start("orders", "alice-1", "alice")
	waitFor(t, "alice-1 to take alice's calls", func() bool { return mustServe(t, orders, "alice") == "alice-1" })
	for range 10 {
		if got := mustServe(t, orders, "alice"); got != "alice-1" {
			t.Fatalf("alice served by %s after alice-1 took over", got)
		}
	}
}

func TestOpenTelemetryInterop(t *testing.T) {
	m := newMesh(t)
	m.start("orders", "base-1", "")
	seen := make(chan string, 10)
	alice := m.start("orders", "alice-1", "alice")
	f := func(ctx context.Context) error {
		// The raw incoming baggage, as the lanes server read it.
		md, _ := metadata.FromIncomingContext(ctx)
		seen <- strings.Join(md.Get("baggage"), ";") + " lane=" + lane.FromContext(ctx)
		return nil
	}
	alice.onUnary.Store(&f)
	fr := m.start("front", "front-1", "", withNext(m.client("orders")))

	// A plain grpc-go client that knows nothing of lanes, only OpenTelemetry
	// baggage.
	otelClient := func(addr string) testpb.TestServiceClient {
		return testpb.NewTestServiceClient(direct(t, addr, grpc.WithStatsHandler(
			otelgrpc.NewClientHandler(otelgrpc.WithPropagators(propagation.Baggage{})))))
	}
	bagCtx := func(members ...string) context.Context {
		var ms []baggage.Member
		for _, kv := range members {
			k, v, _ := strings.Cut(kv, "=")
			mem, err := baggage.NewMember(k, v)
			if err != nil {
				t.Fatal(err)
			}
			ms = append(ms, mem)
		}
		bag, err := baggage.New(ms...)
		if err != nil {
			t.Fatal(err)
		}
		return baggage.ContextWithBaggage(callCtx(t, ""), bag)
	}

	t.Run("direct_through_the_guard", func(t *testing.T) {
		resp, err := otelClient(alice.addr).UnaryCall(bagCtx("lane=alice", "team=x"), &testpb.SimpleRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if resp.ServerId != "alice-1" {
			t.Fatalf("served by %s", resp.ServerId)
		}
		got := <-seen
		if !strings.Contains(got, "team=x") || !strings.HasSuffix(got, " lane=alice") {
			t.Fatalf("alice-1 saw %q", got)
		}
		_, err = otelClient(alice.addr).UnaryCall(bagCtx("team=x"), &testpb.SimpleRequest{})
		expectCode(t, err, codes.FailedPrecondition, `serves lane "alice"`)
	})
	t.Run("through_a_lanes_hop", func(t *testing.T) {
		resp, err := otelClient(fr.addr).UnaryCall(bagCtx("lane=alice", "team=x"), &testpb.SimpleRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if resp.ServerId != "front-1>alice-1" {
			t.Fatalf("path %s", resp.ServerId)
		}
		if got := <-seen; got != "lane=alice,team=x lane=alice" {
			t.Fatalf("alice-1 saw %q", got)
		}
		resp, err = otelClient(fr.addr).UnaryCall(bagCtx("team=x"), &testpb.SimpleRequest{})
		if err != nil || resp.ServerId != "front-1>base-1" {
			t.Fatalf("baseline: %v %v", resp, err)
		}
	})
	t.Run("server_handler_sees_team", func(t *testing.T) {
		// A lanes server that also runs OpenTelemetry's server handler: the
		// handler's baggage keeps team=x.
		teams := make(chan string, 1)
		srv := grpc.NewServer(append(lanesgrpc.ServerOptions(),
			grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithPropagators(propagation.Baggage{}))))...)
		testpb.RegisterTestServiceServer(srv, &bagServer{teams: teams})
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(lis)
		defer srv.Stop()
		if _, err := otelClient(lis.Addr().String()).UnaryCall(bagCtx("lane=alice", "team=x"), &testpb.SimpleRequest{}); err != nil {
			t.Fatal(err)
		}
		if got := <-teams; got != "team=x lane=alice" {
			t.Fatalf("handler saw %q", got)
		}
	})
}

type bagServer struct {
	testpb.UnimplementedTestServiceServer
	teams chan string
}

func (s *bagServer) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	s.teams <- "team=" + baggage.FromContext(ctx).Member("team").Value() + " lane=" + lane.FromContext(ctx)
	return &testpb.SimpleResponse{}, nil
}

func TestBalancerNeedsLanesResolver(t *testing.T) {
	cc := direct(t, "127.0.0.1:1", grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"lanes":{}}]}`))
	_, err := testpb.NewTestServiceClient(cc).EmptyCall(callCtx(t, ""), &testpb.Empty{})
	expectCode(t, err, codes.Unavailable, "needs the lanes resolver")
}

func TestNewClientRefusesBadOptions(t *testing.T) {
	m := newMesh(t)
	if _, err := lanesgrpc.NewClient(m.engine, "orders", lanesgrpc.WithIdempotent("grpc.testing.TestService/UnaryCall")); err == nil || !strings.Contains(err.Error(), "idempotent method") {
		t.Fatalf("bad method name: %v", err)
	}
	if _, err := lanesgrpc.NewClient(m.engine, "orders/x"); err == nil {
		t.Fatal("bad service name accepted")
	}
}

func TestHealthCheck(t *testing.T) {
	m := newMesh(t)
	m.setPolicy("outlier:\n  ejection: 1s\n")
	a := m.start("orders", "a", "")
	m.start("orders", "b", "")
	orders := m.client("orders", lanesgrpc.WithHealthCheck(""))

	seen := map[string]bool{}
	waitFor(t, "both instances to serve", func() bool {
		seen[mustServe(t, orders, "")] = true
		return seen["a"] && seen["b"]
	})
	// a says it is not serving: its connection leaves READY, and every call
	// goes to b.
	a.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	streak := 0
	waitFor(t, "ten calls in a row served by b", func() bool {
		if mustServe(t, orders, "") == "b" {
			streak++
		} else {
			streak = 0
		}
		return streak >= 10
	})
	a.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	waitFor(t, "a to serve again", func() bool { return mustServe(t, orders, "") == "a" })
}

// hang makes b's UnaryCall handler wait for the caller to give up.
func hang(b *backend) {
	f := func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	}
	b.onUnary.Store(&f)
}

// TestHungInstanceEjected: an instance that takes calls and never answers
// them has the call cut by the response-header timeout and is ejected at
// once, whatever the policy's errors; an idempotent call is sent once more,
// to another instance, and a call of another method fails with
// Unavailable.
func TestHungInstanceEjected(t *testing.T) {
	m := newMesh(t)
	m.setPolicy("outlier: {errors: 5, window: 1m, ejection: 10m}\n")
	hung := m.start("orders", "hung", "")
	m.start("orders", "ok", "")
	hang(hung)
	hdr := timing.Bound(500 * time.Millisecond) // the live instance answers well within it
	timeout := lanesgrpc.WithResponseHeaderTimeout(hdr)
	orders := m.client("orders", timeout, lanesgrpc.WithIdempotent("/grpc.testing.TestService/UnaryCall"))
	svc := m.engine.Service("orders")
	start := time.Now()
	cut := 0 // calls that waited for the timeout: the hung instance took them
	for i := 0; ; i++ {
		d, err := svc.Resolve(routing.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(d.Eligible, " ") == "ok" {
			break
		}
		if cut > 0 {
			t.Fatalf("the hung instance is still eligible after a call it took was cut: %v", d.Eligible)
		}
		// The caller's deadline is longer than the timeout, which cuts the
		// attempt first.
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		began := time.Now()
		_, err = orders.UnaryCall(ctx, &testpb.SimpleRequest{})
		cancel()
		if err != nil {
			t.Fatalf("idempotent call %d failed: %v", i, err)
		}
		if time.Since(began) >= hdr {
			cut++
		}
	}
	t.Logf("the hung instance was ejected %v after the first call", time.Since(start).Round(time.Millisecond))

	// Not idempotent: the cut call fails with Unavailable, naming the
	// timeout.
	m2 := newMesh(t)
	hung2 := m2.start("orders", "hung", "")
	hang(hung2)
	other := m2.client("orders", timeout)
	_, err := other.UnaryCall(context.Background(), &testpb.SimpleRequest{})
	expectCode(t, err, codes.Unavailable, "response-header timeout", `"hung"`)
}

// TestRetryFollowsTheLaneChain: when the only instance of a lane fails an
// idempotent call (it answers Unavailable, or hangs past the
// response-header timeout), gRPC's retry goes along the lane chain, to the
// baseline, also while the instance is not ejected (Unavailable is one
// failure of the policy's many; a hung instance is ejected at once); a call
// of another method is not retried.
func TestRetryFollowsTheLaneChain(t *testing.T) {
	idem := lanesgrpc.WithIdempotent("/grpc.testing.TestService/UnaryCall")
	t.Run("unavailable", func(t *testing.T) {
		m := newMesh(t)
		m.setPolicy("outlier: {errors: 1000}\n") // no ejection: every call first goes to alice's instance
		a := m.start("orders", "a", "alice")
		b := m.start("orders", "b", "")
		a.fail.Store(true)
		orders := m.client("orders", idem)
		for i := range 4 {
			if got := mustServe(t, orders, "alice"); got != "b" {
				t.Fatalf("call %d in lane alice: served by %s, want b on the retry", i, got)
			}
		}
		if a.hits.Load() != 4 {
			t.Fatalf("a got %d calls, want each of the 4 first attempts", a.hits.Load())
		}
		if got := b.lastMD().Get(lane.Header); len(got) != 1 || got[0] != "alice" {
			t.Fatalf("b got x-lane %q, want alice (the lane keeps travelling)", got)
		}
		plain := m.client("orders")
		hits := b.hits.Load()
		_, err := servedBy(t, plain, "alice")
		expectCode(t, err, codes.Unavailable, "a is failing")
		if b.hits.Load() != hits {
			t.Fatal("a call of a method that is not idempotent was sent to b too")
		}
	})
	t.Run("hung", func(t *testing.T) {
		m := newMesh(t)
		m.setPolicy("outlier: {errors: 1000}\n")
		a := m.start("orders", "a", "alice")
		m.start("orders", "b", "")
		hang(a)
		orders := m.client("orders", idem, lanesgrpc.WithResponseHeaderTimeout(timing.Bound(300*time.Millisecond)))
		for i := range 2 {
			if got := mustServe(t, orders, "alice"); got != "b" {
				t.Fatalf("call %d in lane alice: served by %s, want b on the retry", i, got)
			}
		}
	})
}
