package gateway

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/lanesdev/lanes/internal/lib/addrpolicy"
)

// TestDialRefusesReserved: an instance whose address reaches one of the
// control plane's listeners, in any form (written into the registry around
// the admin API), is never dialled, on either HTTP/1.1 path: a lane request
// falls back to the baseline, a POST with a body too, and with no other
// instance the call fails with 502 upstream naming the refusal. The
// listener sees no request.
func TestDialRefusesReserved(t *testing.T) { onStacks(t, testDialRefusesReserved) }

func testDialRefusesReserved(t *testing.T) {
	for _, path := range []string{HTTP1Fast, HTTP1Std} {
		t.Run(path, func(t *testing.T) {
			etcd := newBackend(t, "etcd", "alice")
			var res addrpolicy.Reserved
			l, _ := net.ResolveTCPAddr("tcp", etcd.addr)
			if err := res.Add(context.Background(), "etcd client", l); err != nil {
				t.Fatal(err)
			}
			w := newWorld(t, "", Config{HTTP1: path, Dial: &addrpolicy.Rules{Reserved: &res}})
			port := strconv.Itoa(l.Port)
			base := newBackend(t, "base", "")
			w.register(t, "orders", base.id, base.addr, "")
			for i, addr := range []string{etcd.addr, "127.0.0.2:" + port, "[::1]:" + port, "localhost:" + port, "0.0.0.0:" + port} {
				id := "etcd-" + strconv.Itoa(i)
				w.register(t, "orders", id, addr, "alice")
				expectServed(t, w.get(t, "/x", map[string]string{"x-lane": "alice"}), "base", "alice")
				req, err := http.NewRequest(http.MethodPost, w.url+"/", strings.NewReader("order"))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("x-lane", "alice")
				expectServed(t, doReq(t, w.client, req), "base", "alice")
			}
			if n := etcd.hits.Load(); n != 0 {
				t.Fatalf("the reserved listener got %d requests", n)
			}

			// Only the reserved address: a clear failure.
			w2 := newWorld(t, "", Config{HTTP1: path, Dial: &addrpolicy.Rules{Reserved: &res}, Routes: []Route{{Prefix: "/", Service: "kv"}}})
			w2.register(t, "kv", "etcd", etcd.addr, "")
			r := w2.get(t, "/v3/kv/range", nil)
			if r.status != http.StatusBadGateway || r.header.Get("x-lanes-error") != codeUpstream || !strings.Contains(r.body, "control plane") {
				t.Fatalf("got %d %q %q, want 502 upstream naming the control plane", r.status, r.header.Get("x-lanes-error"), r.body)
			}
			if n := etcd.hits.Load(); n != 0 {
				t.Fatalf("the reserved listener got %d requests", n)
			}
		})
	}
}

// TestDialRefusesLinkLocal: without Dial rules, the gateway still refuses
// link-local and cloud metadata addresses.
func TestDialRefusesLinkLocal(t *testing.T) { onStacks(t, testDialRefusesLinkLocal) }

func testDialRefusesLinkLocal(t *testing.T) {
	w := newWorld(t, "", Config{})
	w.register(t, "orders", "meta", "169.254.169.254:80", "")
	r := w.get(t, "/latest/meta-data/", nil)
	if r.status != http.StatusBadGateway || !strings.Contains(r.body, "link-local") {
		t.Fatalf("got %d %q, want 502 naming link-local", r.status, r.body)
	}
}
