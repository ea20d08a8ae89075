package gateway

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/registry"
)

// TestLaneTravelsWithLaneshttp sends requests through the gateway to a
// "web" service that calls "orders" with laneshttp: the lane the gateway
// assigned reaches the second hop, and lane instances behind the guard of
// laneshttp.Handler never see a request outside their lane.
func TestLaneTravelsWithLaneshttp(t *testing.T) { onStacks(t, testLaneTravelsWithLaneshttp) }

func testLaneTravelsWithLaneshttp(t *testing.T) {
	w := newWorld(t, "canary:\n  - {service: orders, lane: canary, percent: 100}\n", Config{
		Routes: []Route{{Prefix: "/", Service: "web"}},
	})
	base := newBackend(t, "orders-base", "")
	alice := newBackend(t, "orders-alice", "alice")
	w.register(t, "orders", base.id, base.addr, "")
	w.register(t, "orders", alice.id, alice.addr, "alice")

	client := laneshttp.NewClient(w.engine)
	t.Cleanup(client.CloseIdleConnections)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	webInst := registry.Instance{ID: "web-1", Service: "web", Addr: l.Addr().String()}
	webGuard := laneshttp.NewGuard(w.engine)
	webGuard.SetInstance(webInst)
	web := laneshttp.Handler(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, "http://orders/", nil)
		res, err := client.Do(req)
		if err != nil {
			if !laneshttp.WriteError(rw, err) {
				http.Error(rw, err.Error(), http.StatusBadGateway)
			}
			return
		}
		defer res.Body.Close()
		rw.Header().Set("Content-Type", "application/json")
		io.Copy(rw, res.Body)
	}), laneshttp.WithGuard(webGuard))
	serveOn(t, l, web)
	w.register(t, "web", webInst.ID, webInst.Addr, "")

	get := func(h map[string]string) echo {
		t.Helper()
		r := w.get(t, "/", h)
		if r.status != http.StatusOK {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		var e echo
		if err := json.Unmarshal([]byte(r.body), &e); err != nil {
			t.Fatal(err)
		}
		return e
	}
	if e := get(map[string]string{"x-lane": "alice"}); e.ID != alice.id || e.hdr(t, "x-lane") != "alice" {
		t.Errorf("x-lane alice: the second hop went to %s with x-lane %q", e.ID, e.hdr(t, "x-lane"))
	}
	if e := get(map[string]string{"cookie": "lane=alice"}); e.ID != alice.id {
		t.Errorf("cookie alice: the second hop went to %s", e.ID)
	}
	// No canary instance of web or orders: the 100% split takes no share.
	if e := get(nil); e.ID != base.id || e.hdr(t, "x-lane") != "" {
		t.Errorf("baseline: the second hop went to %s with x-lane %q", e.ID, e.hdr(t, "x-lane"))
	}
	// A canary instance of orders: baseline traffic at web is not split
	// (web has no canary), and is split at the orders hop.
	can := newBackend(t, "orders-canary", "canary")
	w.register(t, "orders", can.id, can.addr, "canary")
	if e := get(nil); e.ID != can.id {
		t.Errorf("canary at the second hop: went to %s", e.ID)
	}
}
