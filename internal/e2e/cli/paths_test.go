package cli

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lanesdev/lanes/internal/lib/bearer"
	"github.com/lanesdev/lanes/registry"
)

// TestRouteExplainPaths: lanes route explain says which data paths a
// service is on: how its instances joined (their lanes.path label), and
// the xDS clients that call it now.
func TestRouteExplainPaths(t *testing.T) {
	u := startUp(t, "up", "--route", "/=web", "--xds-addr", "127.0.0.1:0")
	m := regexp.MustCompile(`(?m)^xds\s+grpc://(\S+)`).FindStringSubmatch(u.WaitOutput("lanes is up."))
	if m == nil {
		t.Fatalf("no xds address in the output:\n%s", u.Stdout.String())
	}
	u.register(t, u.token, registry.Instance{ID: "o1", Service: "orders", Addr: "127.0.0.1:7001",
		Labels: map[string]string{registry.LabelPath: registry.PathSidecar}})
	u.register(t, u.token, registry.Instance{ID: "o2", Service: "orders", Addr: "127.0.0.1:7002"})

	explain := func() string {
		code, out, errOut := u.cli(t, "route", "explain", "orders")
		if code != 0 {
			t.Fatalf("route explain exited %d: %s", code, errOut)
		}
		return out
	}
	if out := explain(); !strings.Contains(out, "paths: instances sidecar 1, instances unknown 1\n") || strings.Contains(out, "callers") {
		t.Fatalf("before any xDS client:\n%s", out)
	}

	// A proxyless client of orders, as grpc-go asks: its listener.
	cc, err := grpc.NewClient(m[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	st, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: "web-1", UserAgentName: "gRPC Go"},
		TypeUrl: resource.ListenerType, ResourceNames: []string{"orders"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil { // the server holds the subscription once it answers
		t.Fatal(err)
	}
	out := explain()
	if !strings.Contains(out, "paths: instances sidecar 1, instances unknown 1, callers xds 1\n") ||
		!strings.Contains(out, "note: the xds callers route by lanes' xDS resources") {
		t.Fatalf("with a proxyless client of orders:\n%s", out)
	}
	cancel()
	// The subscription ends with the stream.
	deadline := time.Now().Add(wait)
	for strings.Contains(explain(), "callers xds") {
		if time.Now().After(deadline) {
			t.Fatal("the closed stream still counts as a caller")
		}
		time.Sleep(50 * time.Millisecond) // a poll of the control plane's answer, not a bound
	}
}

// TestTokenEnvelope: lanes token envelope writes the token in the envelope
// gRPC's xDS bootstrap sends by itself, readable by its owner only.
func TestTokenEnvelope(t *testing.T) {
	file := filepath.Join(t.TempDir(), "xds.jwt")
	code, out, errOut := run(t, "", "token", "envelope", "--out", file, "--token", "lt_secret", "--expires-in", "2h")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "wrote the token of --token into "+file) {
		t.Errorf("output: %s", out)
	}
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	data, _ := os.ReadFile(file)
	tok, is, err := bearer.Unwrap(strings.TrimSpace(string(data)), time.Now().Add(time.Hour))
	if tok != "lt_secret" || !is || err != nil {
		t.Errorf("the envelope holds %q (%v, %v)", tok, is, err)
	}
	if _, _, err := bearer.Unwrap(strings.TrimSpace(string(data)), time.Now().Add(3*time.Hour)); err == nil {
		t.Error("the envelope is taken past --expires-in")
	}
	if code, _, errOut := run(t, "", "token", "envelope", "--token", "x"); code != 2 || !strings.Contains(errOut, "--out") {
		t.Errorf("without --out: exit %d: %s", code, errOut)
	}
}
