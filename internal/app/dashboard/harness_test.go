package dashboard_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/internal/app/controlplane"
	"github.com/lanesdev/lanes/internal/app/demo"
	"github.com/lanesdev/lanes/internal/testkit/leaktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leaktest.Options()...)
}

// world is `lanes demo` in the test: a control plane with embedded etcd,
// the trace collector and the gateway, and the demo's services traced into
// it.
type world struct {
	srv     *controlplane.Server
	admin   string // the admin API's URL, which serves the dashboard under /ui/
	token   string
	gateway string
	api     *adminclient.Client
}

func startWorld(t *testing.T) *world {
	t.Helper()
	cfg := controlplane.Defaults()
	cfg.DataDir = t.TempDir()
	cfg.AdminAddr, cfg.GatewayAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Etcd.ClientAddr, cfg.Etcd.PeerAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Nats.Addr = controlplane.NatsOff
	cfg.Traces.GRPCAddr, cfg.Traces.HTTPAddr = "127.0.0.1:0", "off"
	cfg.Routes = []string{"/=" + demo.Entry}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := controlplane.Start(ctx, cfg, controlplane.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	store, _ := controlplane.Value(srv, controlplane.StoreKey)
	engine, _ := controlplane.Value(srv, controlplane.EngineKey)
	traces, _ := controlplane.Value(srv, controlplane.TracesKey)
	topo, err := demo.Start(ctx, demo.Config{Registry: store, Engine: engine, Logger: log, Traces: traces.GRPCAddr, TracesToken: traces.Token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { topo.Close() })
	a, _ := controlplane.Value(srv, controlplane.AdminKey)
	gw, _ := controlplane.Value(srv, controlplane.GatewayKey)
	w := &world{srv: srv, admin: a.URL, token: a.Token, gateway: gw.URL}
	w.api, err = adminclient.New(a.URL, a.Token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.api.Close)
	return w
}

// traffic sends requests of the baseline and of both demo lanes through the
// gateway and waits until the collector has traces of each lane.
func (w *world) traffic(t *testing.T) {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(60 * time.Second)
	for {
		for _, l := range []string{"", "feature-x", "alice"} {
			req, _ := http.NewRequest(http.MethodGet, w.gateway+"/", nil)
			if l != "" {
				req.Header.Set("x-lane", l)
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		g, err := w.api.Graph(ctx, 0)
		cancel()
		if err == nil && hasEdge(g.Edges, "web", "orders", "feature-x") && hasEdge(g.Edges, "orders", "payments", "alice") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the collector has no graph of both lanes after 60s: %+v %v", g, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
