package xds_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/app/xds"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// fixture is an xDS server on loopback, fed by an in-memory registry and a
// policy source, with its own metrics.
type fixture struct {
	reg     registry.Registry
	eng     *routing.Engine
	srv     *xds.Server
	addr    string
	metrics *prometheus.Registry
}

func start(t testing.TB, cfg xds.Config) *fixture {
	t.Helper()
	return startOn(t, registry.NewMemory(), cfg)
}

// startOn is start on reg, a registry.Memory or one that wraps it.
func startOn(t testing.TB, reg registry.Registry, cfg xds.Config) *fixture {
	t.Helper()
	f := &fixture{reg: reg, eng: routing.New(routing.WithRegistry(reg)), metrics: prometheus.NewRegistry()}
	t.Cleanup(func() { f.eng.Close(); f.reg.Close() })
	cfg.Registry, cfg.Engine, cfg.Metrics = f.reg, f.eng, f.metrics
	if cfg.Auth == "" {
		cfg.Auth = xds.AuthLoopback
	}
	srv, err := xds.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	f.srv, f.addr = srv, ln.Addr().String()
	return f
}

func (f *fixture) register(t testing.TB, in registry.Instance) registry.Lease {
	t.Helper()
	l, err := f.reg.Register(context.Background(), in, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (f *fixture) setPolicy(t *testing.T, doc string) {
	t.Helper()
	p, err := policy.Parse("policy.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	f.eng.SetPolicy(p)
}

// ads opens an ADS stream with md in its metadata.
func (f *fixture) ads(t *testing.T, ctx context.Context, md ...string) discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesClient {
	t.Helper()
	cc, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	if len(md) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, md...)
	}
	st, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

var node = &corev3.Node{Id: "test-client", Locality: &corev3.Locality{Zone: "az1"}}

func recv(t *testing.T, st discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesClient) *discoverygrpc.DiscoveryResponse {
	t.Helper()
	resp, err := st.Recv()
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	return resp
}

// TestNackIsNotAnsweredWithTheSameResources: a client that refuses a
// response and asks again at once (as grpc-go does) is answered at the
// next change, not again with what it refused; the refusal is counted
// once, however often it is repeated.
func TestNackIsNotAnsweredWithTheSameResources(t *testing.T) {
	f := start(t, xds.Config{})
	f.register(t, registry.Instance{ID: "b1", Service: "orders", Addr: "127.0.0.1:1001"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := f.ads(t, ctx)
	eds := func(version, nonce string, nack bool) {
		req := &discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType,
			ResourceNames: []string{"orders/baseline"}, VersionInfo: version, ResponseNonce: nonce}
		if nack {
			req.ErrorDetail = &status.Status{Code: int32(codes.InvalidArgument), Message: "refused by the test"}
		}
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	eds("", "", false)
	first := recv(t, st)
	for endpointCount(t, first) == 0 {
		// Asked before the registration reached the server.
		eds(first.VersionInfo, first.Nonce, false)
		first = recv(t, st)
	}
	// Refuse it three times over, asking again each time with no version:
	// the server answers nothing now, and counts the refusal once.
	nacks := func() float64 { return sum(f.metrics, "lanes_xds_nacks_total") }
	eds("", first.Nonce, true)
	for nacks() < 1 {
		if ctx.Err() != nil {
			t.Fatalf("the NACK was not counted: %v", ctx.Err())
		}
		time.Sleep(time.Millisecond)
	}
	eds("", first.Nonce, true)
	eds("", first.Nonce, true)
	// A change: its push must be the next thing on the stream.
	f.register(t, registry.Instance{ID: "b2", Service: "orders", Addr: "127.0.0.1:1002"})
	next := recv(t, st)
	if next.VersionInfo == first.VersionInfo {
		t.Fatalf("the refused version %s was sent again", first.VersionInfo)
	}
	if got := nacks(); got != 1 {
		t.Errorf("%v NACKs counted, want 1 (one response refused)", got)
	}
}

// sum is the sum of the series of a metric family (0 for none yet).
func sum(g prometheus.Gatherer, name string) float64 {
	mfs, _ := g.Gather()
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

type tokens map[string]bool

func (ts tokens) Check(_ context.Context, tok string) (bool, adminapi.Token, error) {
	if ts[tok] {
		return false, adminapi.Token{ID: "t1", Lane: "alice"}, nil
	}
	return false, adminapi.Token{}, errors.New("unknown token")
}

// TestTokenAuth: with xds.auth token, a stream needs a token the token
// store accepts; a lane token reads the routes like any client.
func TestTokenAuth(t *testing.T) {
	f := start(t, xds.Config{Auth: xds.AuthToken, Tokens: tokens{"lanes_good": true}})
	f.register(t, registry.Instance{ID: "b1", Service: "orders", Addr: "127.0.0.1:1001"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lds := &discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resource.ListenerType, ResourceNames: []string{"orders"}}
	for _, c := range []struct {
		name string
		md   []string
		code codes.Code
	}{
		{"no token", nil, codes.Unauthenticated},
		{"not a bearer token", []string{"authorization", "Basic eDp5"}, codes.Unauthenticated},
		{"unknown token", []string{"authorization", "Bearer lanes_bad"}, codes.Unauthenticated},
		{"good token", []string{"authorization", "Bearer lanes_good"}, codes.OK},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := f.ads(t, ctx, c.md...)
			if err := st.Send(lds); err != nil && !errors.Is(err, context.Canceled) {
				// The server may end the stream before the send.
				t.Log(err)
			}
			resp, err := st.Recv()
			for err == nil && len(resp.Resources) == 0 {
				// Asked before the registration reached the server.
				next := proto.Clone(lds).(*discoverygrpc.DiscoveryRequest)
				next.VersionInfo, next.ResponseNonce = resp.VersionInfo, resp.Nonce
				st.Send(next)
				resp, err = st.Recv()
			}
			if got := grpcstatus.Code(err); got != c.code {
				t.Fatalf("got %v (%v), want %v", got, err, c.code)
			}
			if c.code == codes.OK && len(resp.Resources) != 1 {
				t.Fatalf("%d listeners, want orders", len(resp.Resources))
			}
		})
	}
	if got := sum(f.metrics, "lanes_xds_refused_total"); got != 3 {
		t.Errorf("%v refusals counted, want 3", got)
	}
}

// TestHostileRequests: a node id, or resource names, beyond the bounds end
// the stream with InvalidArgument.
func TestHostileRequests(t *testing.T) {
	f := start(t, xds.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for name, req := range map[string]*discoverygrpc.DiscoveryRequest{
		"long node id":       {Node: &corev3.Node{Id: strings.Repeat("n", xds.MaxNodeIDBytes+1)}, TypeUrl: resource.ListenerType},
		"long resource name": {Node: node, TypeUrl: resource.ClusterType, ResourceNames: []string{strings.Repeat("c", xds.MaxResourceNameBytes+1)}},
		"many names":         {Node: node, TypeUrl: resource.ClusterType, ResourceNames: make([]string, xds.MaxResourceNames+1)},
	} {
		t.Run(name, func(t *testing.T) {
			st := f.ads(t, ctx)
			if err := st.Send(req); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Recv(); grpcstatus.Code(err) != codes.InvalidArgument {
				t.Fatalf("got %v, want InvalidArgument", err)
			}
		})
	}
}

// TestSeparateAndDeltaStreams: the clusters on their own stream (CDS, as
// a client without ADS asks), and the endpoints over incremental ADS.
func TestSeparateAndDeltaStreams(t *testing.T) {
	f := start(t, xds.Config{})
	f.register(t, registry.Instance{ID: "b1", Service: "orders", Addr: "127.0.0.1:1001"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cc, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()

	cds, err := clusterservice.NewClusterDiscoveryServiceClient(cc).StreamClusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := &discoverygrpc.DiscoveryRequest{Node: node, ResourceNames: []string{"orders/baseline"}}
	for {
		if err := cds.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := cds.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.TypeUrl != resource.ClusterType {
			t.Fatalf("type %s on the cluster stream", resp.TypeUrl)
		}
		if len(resp.Resources) == 1 {
			break
		}
		req.VersionInfo, req.ResponseNonce = resp.VersionInfo, resp.Nonce
	}

	delta, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := delta.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.EndpointType,
		ResourceNamesSubscribe: []string{"orders/baseline"}}); err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := delta.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Resources) == 1 && resp.Resources[0].Name == "orders/baseline" {
			cla := &endpointv3.ClusterLoadAssignment{}
			if err := resp.Resources[0].Resource.UnmarshalTo(cla); err != nil {
				t.Fatal(err)
			}
			if len(cla.Endpoints) == 1 {
				return
			}
		}
		if err := delta.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResponseNonce: resp.Nonce}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLaneExpires: at a lane's expiry, its instances leave the resources,
// without any other change.
func TestLaneExpires(t *testing.T) {
	f := start(t, xds.Config{})
	at := time.Now().Add(2 * time.Second).UTC()
	f.setPolicy(t, "lanes: {alice: {expires: "+at.Format(time.RFC3339Nano)+"}}\n")
	f.register(t, registry.Instance{ID: "a1", Service: "orders", Addr: "127.0.0.1:1001", Lane: "alice"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := f.ads(t, ctx)
	req := &discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: []string{"orders/lane/alice"}}
	had := false
	for {
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
		resp := recv(t, st)
		switch {
		case endpointCount(t, resp) > 0:
			had = true
		case had:
			if late := time.Since(at); late < 0 {
				t.Fatalf("a1 left %v before its lane's expiry", -late)
			}
			return
		}
		req.VersionInfo, req.ResponseNonce = resp.VersionInfo, resp.Nonce
	}
}

// endpointCount is the number of endpoints of the assignments of resp.
func endpointCount(t testing.TB, resp *discoverygrpc.DiscoveryResponse) int {
	t.Helper()
	n := 0
	for _, r := range resp.Resources {
		cla := &endpointv3.ClusterLoadAssignment{}
		if err := r.UnmarshalTo(cla); err != nil {
			t.Fatal(err)
		}
		for _, l := range cla.Endpoints {
			n += len(l.LbEndpoints)
		}
	}
	return n
}

// outageRegistry is a registry that reports the outages the test marks.
type outageRegistry struct {
	registry.Registry
	clock registry.OutageClock
}

func (r *outageRegistry) LastOutage() time.Time { return r.clock.Last() }

// TestHeldThroughOutage: instances whose leases all end just after an
// outage of the registry are held by the engine, and so stay endpoints of
// the proxyless clients, until they register again or the grace ends.
func TestHeldThroughOutage(t *testing.T) {
	reg := &outageRegistry{Registry: registry.NewMemory()}
	f := startOn(t, reg, xds.Config{})
	b1 := f.register(t, registry.Instance{ID: "b1", Service: "orders", Addr: "127.0.0.1:1001"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := f.ads(t, ctx)
	req := &discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: []string{"orders/baseline"}}
	ids := func() []string {
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
		resp := recv(t, st)
		req.VersionInfo, req.ResponseNonce = resp.VersionInfo, resp.Nonce
		var out []string
		for _, r := range resp.Resources {
			cla := &endpointv3.ClusterLoadAssignment{}
			if err := r.UnmarshalTo(cla); err != nil {
				t.Fatal(err)
			}
			for _, l := range cla.Endpoints {
				for _, e := range l.LbEndpoints {
					out = append(out, e.GetMetadata().GetFilterMetadata()["lanes"].GetFields()["id"].GetStringValue())
				}
			}
		}
		slices.Sort(out)
		return out
	}
	for !slices.Equal(ids(), []string{"b1"}) { // until the registration is in
	}
	// The engine holds what it has seen: wait for it to have b1 (the
	// resources may have come from the registry's watch before it listed).
	orders := f.eng.Service("orders")
	for {
		changed := orders.Changed()
		if len(orders.Instances()) == 1 {
			break
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatal("the engine never had b1")
		}
	}
	// The registry was out; b1's lease ends just after (as every lease
	// does when a stalled store serves again).
	reg.clock.Mark(time.Now())
	b1.Close()
	f.register(t, registry.Instance{ID: "b2", Service: "orders", Addr: "127.0.0.1:1002"})
	for {
		got := ids()
		if !slices.Contains(got, "b1") {
			t.Fatalf("endpoints %v: b1 was dropped, not held", got)
		}
		if slices.Contains(got, "b2") {
			return
		}
	}
}
