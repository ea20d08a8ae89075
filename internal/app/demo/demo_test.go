package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestTopology runs the demo on the in-memory registry and follows requests
// of each lane from web down the chain.
func TestTopology(t *testing.T) {
	reg := registry.NewMemory()
	defer reg.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	engine := routing.New(routing.WithRegistry(reg), routing.WithLogger(log))
	defer engine.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topo, err := Start(ctx, Config{Registry: reg, Engine: engine, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer topo.Close()

	res, err := engine.Pick(Entry, routing.Request{})
	if err != nil {
		t.Fatal(err)
	}
	web := "http://" + res.Instance.Addr + "/"
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	for l, want := range map[string]string{
		"":          "[{web web-1 } {orders orders-1 } {payments payments-1 }]",
		"feature-x": "[{web web-1 } {orders orders-feature-x feature-x} {payments payments-1 }]",
		"alice":     "[{web web-1 } {orders orders-1 } {payments payments-alice alice}]",
	} {
		req, _ := http.NewRequest(http.MethodGet, web, nil)
		if l != "" {
			req.Header.Set("x-lane", l)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var got Response
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || fmt.Sprint(got.Hops) != want {
			t.Errorf("lane %q: %d %v %v, want %s", l, resp.StatusCode, err, got.Hops, want)
		}
	}
	// The guard: a lane instance refuses a baseline request.
	res, err = engine.Pick("payments", routing.Request{Lane: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get("http://" + res.Instance.Addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("baseline request to payments-alice: %d, want 421", resp.StatusCode)
	}
	// Close deregisters every instance.
	topo.Close()
	deadline := time.Now().Add(10 * time.Second)
	for len(engine.Service("web").Instances()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("web instances left after Close: %v", engine.Service("web").Instances())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
