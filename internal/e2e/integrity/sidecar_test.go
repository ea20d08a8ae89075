package integrity

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/app/sidecar"
	"github.com/lanesdev/lanes/routing"
)

// behindSidecar serves a plain net/http app, which knows nothing of lanes, as
// an instance of service in lane l behind a sidecar traced into the
// collector. The app calls next through the sidecar's outbound proxy, with
// the request headers that forward copies; it returns the app's answer.
func (w *world) behindSidecar(service, l, next string, forward ...string) {
	w.t.Helper()
	var proxy *url.URL
	client := &http.Client{Transport: &http.Transport{Proxy: func(*http.Request) (*url.URL, error) { return proxy, nil }}, Timeout: patience}
	app := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, "http://"+next+"/", nil)
		for _, h := range forward {
			if v := r.Header.Get(h); v != "" {
				req.Header.Set(h, v)
			}
		}
		res, err := client.Do(req)
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadGateway)
			return
		}
		defer res.Body.Close()
		io.Copy(rw, res.Body)
	}))
	w.t.Cleanup(app.Close)
	w.t.Cleanup(client.CloseIdleConnections)
	s, err := sidecar.Listen(sidecar.Config{Service: service, Lane: l, Listen: "127.0.0.1:0", App: app.Listener.Addr().String(),
		Getenv: noEnv, Logger: slog.New(slog.DiscardHandler), TracerProvider: w.provider(service), Drain: -1, ReadyInterval: 20 * time.Millisecond}, w.reg, w.engine)
	if err != nil {
		w.t.Fatal(err)
	}
	proxy = &url.URL{Scheme: "http", Host: s.ProxyAddr().String()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }() // stopped at cleanup
	w.t.Cleanup(func() {
		cancel()
		<-done
	})
	svc := w.engine.Service(service)
	deadline := time.Now().Add(patience)
	for s.Registered() == "" || !listedAt(svc, s.Registered()) {
		if time.Now().After(deadline) {
			w.t.Fatalf("the sidecar of %s did not register", service)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// listedAt reports whether svc lists an instance at addr.
func listedAt(svc *routing.Service, addr string) bool {
	for _, in := range svc.Instances() {
		if in.Addr == addr {
			return true
		}
	}
	return false
}

// TestSidecarHop: a hop through a sidecar is traced like any other. An app
// behind a sidecar that forwards the lane (x-lane, baggage) and the
// traceparent the sidecar gave it keeps its request in the lane, and the
// collector finds nothing; one that forwards only the traceparent loses the
// lane, and the collector flags it lane_lost: the sidecar's server span,
// with the lane, is the parent of its client span, without.
func TestSidecarHop(t *testing.T) {
	w := newWorld(t)
	w.instance("orders", "orders-1", "", leaf("orders-1"))
	w.instance("orders", "orders-alice", "alice", leaf("orders-alice"))
	w.behindSidecar("web", "", "orders", "X-Lane", "Baggage", "Traceparent")
	w.behindSidecar("shop", "", "orders", "Traceparent")

	got, id := w.enter("web", "alice")
	if got != "orders-alice" {
		t.Fatalf("web in lane alice reached %q", got)
	}
	// Each hop with its lane: the edge's call, the sidecar's server span (web), its client span
	// (web calls orders, served by alice), the instance's server span.
	want := []string{"client edge->web alice/", "server web alice/", "client web->orders alice/alice", "server orders alice/alice"}
	deadline := time.Now().Add(patience)
	for {
		tr, _ := w.col.Trace(id)
		var hops []string
		for _, h := range tr.Hops {
			if h.Kind == "server" && h.Service == "edge" {
				continue
			}
			hop := h.Kind + " " + h.Service
			if h.Callee != "" {
				hop += "->" + h.Callee
			}
			hops = append(hops, hop+" "+h.Requested+"/"+h.Served)
		}
		if strings.Join(hops, ", ") == strings.Join(want, ", ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the trace's hops %q, want %q", hops, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got, _ := w.enter("web", ""); got != "orders-1" {
		t.Fatalf("web in the baseline reached %q", got)
	}
	if got, id := w.enter("shop", "alice"); got != "orders-1" {
		t.Fatalf("shop, which drops the lane, reached %q", got)
	} else {
		fs := w.findings(1)
		if len(fs) != 1 {
			t.Fatalf("findings %+v", fs)
		}
		if f := fs[0]; f.Kind != adminapi.FindingLaneLost || f.Service != "shop" || f.TraceID != id ||
			!strings.Contains(f.Message, `carries lane "" but its parent`) || !strings.Contains(f.Message, `carries "alice"`) {
			t.Fatalf("finding %+v", f)
		}
	}
}
