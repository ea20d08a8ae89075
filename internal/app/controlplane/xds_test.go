package controlplane

import (
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/lanesdev/lanes/registry"
)

// TestXDS: lanes up with xds.addr serves the routes of the registry's
// services; with xds.auth token, a stream needs a token.
func TestXDS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	x, adm := startXDS(ctx, t, minimalConfig(t))
	cc, err := grpc.NewClient(x.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	lds := func(md ...string) (*discoverygrpc.DiscoveryResponse, error) { return listeners(ctx, cc, md...) }
	if _, err := lds(); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("without a token: %v, want Unauthenticated", err)
	}
	resp, err := lds("authorization", "Bearer "+adm.Token)
	if err != nil {
		t.Fatalf("with the admin token: %v", err)
	}
	if len(resp.Resources) != 1 {
		t.Fatalf("%d listeners, want orders", len(resp.Resources))
	}
}

// minimalConfig is a control plane on free loopback ports, with its data in
// a temporary directory, without NATS and the trace collector.
func minimalConfig(t *testing.T) Config {
	cfg := Defaults()
	cfg.DataDir = t.TempDir()
	cfg.AdminAddr, cfg.GatewayAddr, cfg.Etcd.ClientAddr, cfg.Etcd.PeerAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.Nats.Addr, cfg.Traces.GRPCAddr, cfg.Traces.HTTPAddr = NatsOff, TracesOff, TracesOff
	return cfg
}

// listeners asks for the listener of orders on an ADS stream of cc with md,
// until it has it.
func listeners(ctx context.Context, cc *grpc.ClientConn, md ...string) (*discoverygrpc.DiscoveryResponse, error) {
	sctx, scancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx, md...))
	defer scancel()
	ads, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(sctx)
	if err != nil {
		return nil, err
	}
	req := &discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "t"}, TypeUrl: resource.ListenerType, ResourceNames: []string{"orders"}}
	for {
		ads.Send(req)
		resp, err := ads.Recv()
		if err != nil || len(resp.Resources) > 0 {
			return resp, err
		}
		// Asked before the registration reached the server: wait for
		// the next version.
		req.VersionInfo, req.ResponseNonce = resp.VersionInfo, resp.Nonce
	}
}

// TestXDSTLS: with tls.cert, the xDS server serves TLS, so that the
// tokens of its clients do not cross in clear.
func TestXDSTLS(t *testing.T) {
	cfg, files := tlsConfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	x, adm := startXDS(ctx, t, cfg)
	creds, err := credentials.NewClientTLSFromFile(files.CA, "")
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		creds credentials.TransportCredentials
		ok    bool
	}{"TLS": {creds, true}, "plain": {insecure.NewCredentials(), false}} {
		cc, err := grpc.NewClient(x.Addr, grpc.WithTransportCredentials(c.creds))
		if err != nil {
			t.Fatal(err)
		}
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := listeners(cctx, cc, "authorization", "Bearer "+adm.Token)
		ccancel()
		cc.Close()
		if c.ok && (err != nil || len(resp.Resources) != 1) {
			t.Errorf("%s: %v, want the listener of orders", name, err)
		}
		if !c.ok && err == nil {
			t.Errorf("%s: answered, want a failure", name)
		}
	}
}

// startXDS starts cfg with the xDS server on a free port and xds.auth
// token, and registers the instance b1 of orders.
func startXDS(ctx context.Context, t *testing.T, cfg Config) (XDSInfo, AdminInfo) {
	t.Helper()
	cfg.XDS = XDSConfig{Addr: "127.0.0.1:0", Auth: "token"}
	s := startQuiet(t, cfg)
	st, _ := Value(s, StoreKey)
	lease, err := st.Register(ctx, registry.Instance{ID: "b1", Service: "orders", Addr: "127.0.0.1:1001"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lease.Close() })
	x, _ := Value(s, XDSKey)
	adm, _ := Value(s, AdminKey)
	return x, adm
}
