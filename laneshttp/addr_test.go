package laneshttp_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/registry"
)

// TestDefaultBaseRefusesMetadata: the default base never connects to a
// link-local or cloud metadata address that an instance was registered
// with: the instance is unreachable, and the call, a POST too, moves on
// along the lane's chain; with no other instance it fails, naming the rule.
func TestDefaultBaseRefusesMetadata(t *testing.T) {
	f := newFleet(t, "")
	f.start("base orders")
	for i, addr := range []string{"169.254.169.254:80", "[fd00:ec2::254]:80", "100.100.100.200:80", "[fe80::1]:80"} {
		lease, err := f.reg.Register(context.Background(), registry.Instance{ID: "meta" + string(rune('a'+i)), Service: "orders", Lane: "alice", Addr: addr}, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lease.Close() })
	}
	f.await("orders", 5)
	c := laneshttp.NewClient(f.e, laneshttp.WithEnv(noEnv))
	defer c.CloseIdleConnections()
	ctx := lane.WithLane(bg(t), "alice")
	for i := range 8 {
		code, body, _, err := call(ctx, c, http.MethodPost, "http://orders/", bytes.NewReader([]byte("order")))
		if err != nil || code != 200 || body != "base" {
			t.Fatalf("POST %d in lane alice: %d %q %v, want the baseline's answer", i, code, body, err)
		}
	}

	g := newFleet(t, "")
	lease, err := g.reg.Register(context.Background(), registry.Instance{ID: "meta", Service: "orders", Addr: "169.254.169.254:80"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Close()
	g.await("orders", 1)
	c2 := laneshttp.NewClient(g.e, laneshttp.WithEnv(noEnv))
	defer c2.CloseIdleConnections()
	if _, _, _, err := call(bg(t), c2, http.MethodGet, "http://orders/", nil); err == nil || !strings.Contains(err.Error(), "link-local") {
		t.Fatalf("GET of a metadata instance: %v, want an error naming link-local", err)
	}
}
