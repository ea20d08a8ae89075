package xds_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	grpcxds "google.golang.org/grpc/xds" // the xds:/// resolver and the xDS balancers

	"github.com/lanesdev/lanes/internal/app/xds"
	"github.com/lanesdev/lanes/registry"
)

// backend is a real gRPC server on loopback that answers the health check
// with its instance id in the response header.
type backend struct {
	healthpb.UnimplementedHealthServer
	id   string
	fail bool // every call fails
}

func (b *backend) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if b.fail {
		return nil, grpcstatus.Errorf(codes.Internal, "instance %s fails", b.id)
	}
	grpc.SetHeader(ctx, metadata.Pairs("instance", b.id))
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// serveBackend starts a backend and registers it in f's registry as in,
// at its address. The lease is returned, to deregister it.
func serveBackend(t *testing.T, f *fixture, in registry.Instance) registry.Lease {
	t.Helper()
	return serve(t, f, &backend{id: in.ID}, in)
}

func serve(t *testing.T, f *fixture, b *backend, in registry.Instance) registry.Lease {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, b)
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	in.Addr = ln.Addr().String()
	return f.register(t, in)
}

// xdsClient is grpc-go's xDS client of xds:///orders, bootstrapped to f's
// server, as a client in zone az1.
func xdsClient(t *testing.T, f *fixture) healthpb.HealthClient {
	t.Helper()
	bootstrap := fmt.Sprintf(`{
		"xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
		"node": {"id": "grpc-go-test", "locality": {"zone": "az1"}}
	}`, f.addr)
	rb, err := grpcxds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///orders", grpc.WithResolvers(rb), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return healthpb.NewHealthClient(cc)
}

// TestGRPCClient: grpc-go's own xDS client (xds:///orders), with no lanes
// code, against the server on loopback and real gRPC backends registered
// in the registry. A call's lane rides in its x-lane or baggage metadata.
func TestGRPCClient(t *testing.T) {
	f := start(t, xds.Config{Debounce: 10 * time.Millisecond})
	serveBackend(t, f, registry.Instance{ID: "b1", Service: "orders"})
	serveBackend(t, f, registry.Instance{ID: "b2", Service: "orders"})
	alice := serveBackend(t, f, registry.Instance{ID: "a1", Service: "orders", Lane: "alice"})

	health := xdsClient(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// call makes one call with md and returns the instance that served it.
	baselineOnLane := 0 // baseline calls served by a lane instance other than a canary's
	try := func(md ...string) (string, error) {
		cctx, ccancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, md...), 10*time.Second)
		defer ccancel()
		var h metadata.MD
		if _, err := health.Check(cctx, &healthpb.HealthCheckRequest{}, grpc.Header(&h), grpc.WaitForReady(true)); err != nil {
			return "", err
		}
		id := h.Get("instance")
		if len(id) != 1 {
			return "", fmt.Errorf("no instance header")
		}
		if len(md) == 0 && id[0] == "a1" {
			baselineOnLane++
		}
		return id[0], nil
	}
	call := func(md ...string) string {
		t.Helper()
		id, err := try(md...)
		if err != nil {
			t.Fatalf("call with %v: %v", md, err)
		}
		return id
	}
	// await calls until one is served by want: a change on its way to
	// the client. A call that fails meanwhile is counted: grpc-go fails
	// a call for an instant when its routes start naming a cluster its
	// balancer has not yet taken in ("unknown cluster selected").
	transient := 0
	await := func(want string, md ...string) {
		t.Helper()
		for {
			id, err := try(md...)
			if err != nil {
				if grpcstatus.Code(err) != codes.Unavailable {
					t.Fatalf("call with %v: %v", md, err)
				}
				transient++
				t.Logf("call with %v while the change reaches the client: %v", md, err)
			}
			if id == want {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("calls with %v never reached %s", md, want)
			}
		}
	}
	count := func(n int, md ...string) map[string]int {
		got := map[string]int{}
		for range n {
			got[call(md...)]++
		}
		return got
	}

	// The client has the resources once a1 serves its lane.
	await("a1", "x-lane", "alice")

	// Lanes by x-lane and by baggage; the baseline never on a1.
	if got := count(40); got["a1"] > 0 || got["b1"]+got["b2"] != 40 {
		t.Fatalf("baseline calls served by %v, want b1 and b2 only", got)
	}
	if got := count(20, "x-lane", "alice"); got["a1"] != 20 {
		t.Fatalf("x-lane alice calls served by %v, want a1", got)
	}
	if got := count(20, "baggage", "k=v,lane=Alice"); got["a1"] != 20 {
		t.Fatalf("baggage lane=Alice calls served by %v, want a1", got)
	}
	if got := count(20, "x-lane", "bob"); got["a1"] > 0 {
		t.Fatalf("x-lane bob calls served by %v, want the baseline", got)
	}

	// The lane's instance is deregistered: its calls fall back to the
	// baseline, once the push has reached the client.
	pushed := f.srv.Pushed()
	if err := alice.Close(); err != nil {
		t.Fatal(err)
	}
	<-pushed
	await("b1", "x-lane", "alice")
	if got := count(20, "x-lane", "alice"); got["a1"] > 0 {
		t.Fatalf("after a1 left, x-lane alice calls served by %v, want the baseline", got)
	}

	// A canary: 20% of the baseline calls to lane gray.
	serveBackend(t, f, registry.Instance{ID: "g1", Service: "orders", Lane: "gray"})
	f.setPolicy(t, "canary: [{service: orders, lane: gray, percent: 20}]\n")
	await("g1")
	const n = 400
	got := count(n)
	share := float64(got["g1"]) / n
	t.Logf("of %d baseline calls, %v: %.1f%% in the canary", n, got, 100*share)
	if share < 0.12 || share > 0.28 {
		t.Errorf("the canary took %.1f%% of the baseline calls, want 20%% (12..28)", 100*share)
	}
	t.Logf("%d calls failed while a change reached the client", transient)
	if baselineOnLane != 0 {
		t.Errorf("%d baseline calls reached lane instance a1", baselineOnLane)
	}
}

// TestGRPCClientEjection: a lane instance that fails every call is ejected
// by the client's outlier detection, set from the policy, and the lane's
// calls follow its chain to the baseline.
func TestGRPCClientEjection(t *testing.T) {
	f := start(t, xds.Config{Debounce: 10 * time.Millisecond})
	f.setPolicy(t, "outlier: {errors: 2, window: 1s, ejection: 1m}\n")
	serveBackend(t, f, registry.Instance{ID: "b1", Service: "orders"})
	serve(t, f, &backend{id: "a1", fail: true}, registry.Instance{ID: "a1", Service: "orders", Lane: "alice"})
	health := xdsClient(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	failed, start := 0, time.Time{}
	for {
		cctx, ccancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "x-lane", "alice"), 10*time.Second)
		var h metadata.MD
		_, err := health.Check(cctx, &healthpb.HealthCheckRequest{}, grpc.Header(&h), grpc.WaitForReady(true))
		ccancel()
		switch {
		case grpcstatus.Code(err) == codes.Internal: // a1 answered, failing
			if failed == 0 {
				start = time.Now()
			}
			failed++
		case err != nil:
			t.Fatalf("call: %v", err)
		case failed > 0 && h.Get("instance")[0] == "b1": // (before a1 fails, its registration is on its way)
			t.Logf("a1 failed %d calls, then its lane's calls went to the baseline %v after the first failure", failed, time.Since(start).Round(time.Millisecond))
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("a1 failed %d calls and was never ejected", failed)
		}
	}
}
