package gateway

import (
	"testing"

	"github.com/lanesdev/lanes/registry"
)

// The gateway routes from its own host (Config.Host; by default LANES_HOST,
// else the machine's host name): with the policy's locality.host on, to
// the instances on that host when there are some.
func TestSameHost(t *testing.T) { onStacks(t, testSameHost) }

func testSameHost(t *testing.T) {
	w := newWorld(t, "locality: {host: true}\n", Config{Host: "h1"})
	near, far := newBackend(t, "near", ""), newBackend(t, "far", "")
	w.registerInst(t, registry.Instance{ID: "near", Service: "orders", Addr: near.addr, Host: "h1"})
	w.registerInst(t, registry.Instance{ID: "far", Service: "orders", Addr: far.addr, Host: "h2"})
	for range 10 {
		expectServed(t, w.get(t, "/x", nil), "near", "")
	}
	w.setPolicy(t, "locality: {host: false}\n")
	seen := map[string]bool{}
	for range 10 {
		r := w.get(t, "/x", nil)
		seen[r.echo.ID] = true
	}
	if !seen["near"] || !seen["far"] {
		t.Fatalf("locality.host off: served by %v, want both hosts", seen)
	}
}

func TestHostDefaultsToTheLocalHost(t *testing.T) { onStacks(t, testHostDefaultsToTheLocalHost) }

func testHostDefaultsToTheLocalHost(t *testing.T) {
	w := newWorld(t, "", Config{})
	if want := registry.LocalHost(nil); w.gw.host != want || want == "" {
		t.Fatalf("gateway host %q, want %q", w.gw.host, want)
	}
}
