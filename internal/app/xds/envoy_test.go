package xds_test

import (
	"context"
	"net/netip"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lanesdev/lanes/internal/app/xds"
	"github.com/lanesdev/lanes/internal/lib/xdsroute"
	"github.com/lanesdev/lanes/registry"
)

// TestEnvoyVariant: a node that says it is Envoy (by its user agent, or by
// lanes.variant) gets the Envoy variant, with its listener where
// lanes.egress says; a gRPC node, and an Envoy node that asks for the gRPC
// variant, get the gRPC one. No Envoy runs here: the resources' reading is
// checked by internal/lib/xdsroute's evaluator, and their validity by the
// protos' rules there.
func TestEnvoyVariant(t *testing.T) {
	f := start(t, xds.Config{})
	f.register(t, registry.Instance{ID: "b1", Service: "orders", Addr: "127.0.0.1:7001"})
	f.register(t, registry.Instance{ID: "a1", Service: "orders", Addr: "127.0.0.1:7002", Lane: "alice"})

	meta := func(kv map[string]any) *structpb.Struct {
		s, err := structpb.NewStruct(kv)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for name, tc := range map[string]struct {
		node   *corev3.Node
		envoy  bool
		egress string
	}{
		"envoy by user agent": {node: &corev3.Node{Id: "e1", UserAgentName: "envoy"}, envoy: true, egress: "127.0.0.1:15001"},
		"envoy with egress": {node: &corev3.Node{Id: "e2", UserAgentName: "envoy",
			Metadata: meta(map[string]any{xds.MetaEgress: "[::1]:15006"})}, envoy: true, egress: "[::1]:15006"},
		"envoy by metadata, bad egress": {node: &corev3.Node{Id: "e3",
			Metadata: meta(map[string]any{xds.MetaVariant: "envoy", xds.MetaEgress: "localhost:1"})}, envoy: true, egress: "127.0.0.1:15001"},
		"grpc":              {node: &corev3.Node{Id: "g1", UserAgentName: "gRPC Go"}},
		"envoy asking grpc": {node: &corev3.Node{Id: "g2", UserAgentName: "envoy", Metadata: meta(map[string]any{xds.MetaVariant: "grpc"})}},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			st := f.ads(t, ctx)
			// Envoy asks for every listener and cluster (wildcard); gRPC
			// for its target's, then the chain's.
			var lnames, cnames []string
			if !tc.envoy {
				lnames, cnames = []string{"orders"}, []string{"orders/chain/alice"}
			}
			if err := st.Send(&discoverygrpc.DiscoveryRequest{Node: tc.node, TypeUrl: resource.ListenerType, ResourceNames: lnames}); err != nil {
				t.Fatal(err)
			}
			resp := recv(t, st)
			if len(resp.Resources) != 1 {
				t.Fatalf("%d listeners, want 1", len(resp.Resources))
			}
			l := &listenerv3.Listener{}
			if err := resp.Resources[0].UnmarshalTo(l); err != nil {
				t.Fatal(err)
			}
			if tc.envoy {
				sa := l.GetAddress().GetSocketAddress()
				if l.Name != xdsroute.EgressName || l.GetApiListener() != nil || sa == nil {
					t.Fatalf("listener %s (api listener %v), want Envoy's %s on a socket", l.Name, l.GetApiListener() != nil, xdsroute.EgressName)
				}
				if got := netip.AddrPortFrom(netip.MustParseAddr(sa.GetAddress()), uint16(sa.GetPortValue())).String(); got != tc.egress {
					t.Errorf("listener on %s, want %s", got, tc.egress)
				}
			} else if l.Name != "orders" || l.GetApiListener() == nil {
				t.Fatalf("listener %s, want the API listener orders", l.Name)
			}
			if err := st.Send(&discoverygrpc.DiscoveryRequest{Node: tc.node, TypeUrl: resource.ClusterType, ResourceNames: cnames}); err != nil {
				t.Fatal(err)
			}
			resp = recv(t, st)
			aggregates := 0
			for _, a := range resp.Resources {
				c := &clusterv3.Cluster{}
				if err := a.UnmarshalTo(c); err != nil {
					t.Fatal(err)
				}
				if c.GetClusterType() == nil {
					continue
				}
				aggregates++
				if provided := c.LbPolicy == clusterv3.Cluster_CLUSTER_PROVIDED; provided != tc.envoy {
					t.Errorf("aggregate cluster %s: lb_policy %v", c.Name, c.LbPolicy)
				}
			}
			if aggregates == 0 {
				t.Errorf("no aggregate cluster among %d", len(resp.Resources))
			}
		})
	}
}

// TestCallers: the server counts the streams that ask for a service's
// listener, by variant; Envoy's asks for every one; a delta stream's
// subscriptions count as they are added and removed.
func TestCallers(t *testing.T) {
	f := start(t, xds.Config{})
	f.register(t, registry.Instance{ID: "b1", Service: "orders", Addr: "127.0.0.1:7001"})
	f.register(t, registry.Instance{ID: "p1", Service: "payments", Addr: "127.0.0.1:7002"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	g := f.ads(t, ctx)
	if err := g.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "g"}, TypeUrl: resource.ListenerType, ResourceNames: []string{"orders"}}); err != nil {
		t.Fatal(err)
	}
	recv(t, g)
	e := f.ads(t, ctx)
	if err := e.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "e", UserAgentName: "envoy"}, TypeUrl: resource.ListenerType}); err != nil {
		t.Fatal(err)
	}
	recv(t, e)
	cc, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	d, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "d"}, TypeUrl: resource.ListenerType, ResourceNamesSubscribe: []string{"payments", "orders"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Recv(); err != nil {
		t.Fatal(err)
	}
	for svc, want := range map[string][2]int{"orders": {2, 1}, "payments": {1, 1}, "ledger": {0, 1}} {
		if grpc, envoy := f.srv.Callers(svc); grpc != want[0] || envoy != want[1] {
			t.Errorf("callers of %s: %d gRPC, %d Envoy; want %v", svc, grpc, envoy, want)
		}
	}
	if err := d.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resource.ListenerType, ResourceNamesUnsubscribe: []string{"orders"}}); err != nil {
		t.Fatal(err)
	}
	// The unsubscription is taken in before the next request is read:
	// a second one, answered, orders them.
	if err := d.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"payments/baseline"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Recv(); err != nil {
		t.Fatal(err)
	}
	if grpc, _ := f.srv.Callers("orders"); grpc != 1 {
		t.Errorf("callers of orders after the delta stream left it: %d gRPC, want 1", grpc)
	}
}
