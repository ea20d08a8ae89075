// Package demo is the sample topology of `lanes demo`: a chain of HTTP
// services, web → orders → payments, on loopback ports, with a baseline
// instance of each, a feature-x instance of orders and an alice instance of
// payments. Each instance answers with the hops the request took:
//
//	{"hops": [{"service": "web", "instance": "web-1", "lane": ""},
//	          {"service": "orders", "instance": "orders-feature-x", "lane": "feature-x"},
//	          {"service": "payments", "instance": "payments-1", "lane": ""}]}
//
// where lane is the lane of the instance that served ("" for the baseline).
// The services run on the lanes HTTP transport (laneshttp): Serve registers
// them and reads the lane of each request, and a laneshttp client calls
// http://orders/ and http://payments/ in the request's lane.
package demo

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/lanesdev/lanes/internal/lib/traceexport"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/lanestrace"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// Hop is one service a request went through.
type Hop struct {
	Service  string `json:"service"`
	Instance string `json:"instance"`
	Lane     string `json:"lane"`
}

// Response is what every demo instance answers.
type Response struct {
	Hops  []Hop  `json:"hops"`
	Error string `json:"error,omitempty"`
}

// Instance is one instance of the topology.
type Instance struct {
	Service, ID, Lane string
	// Next is the service it calls, "" for none.
	Next string
}

// Instances is the topology.
var Instances = []Instance{
	{Service: "web", ID: "web-1", Next: "orders"},
	{Service: "orders", ID: "orders-1", Next: "payments"},
	{Service: "orders", ID: "orders-feature-x", Lane: "feature-x", Next: "payments"},
	{Service: "payments", ID: "payments-1"},
	{Service: "payments", ID: "payments-alice", Lane: "alice"},
}

// Entry is the service the gateway route "/" goes to.
const Entry = "web"

// Config configures Start.
type Config struct {
	// Registry registers the instances; Engine routes their calls and
	// guards lane instances. Both required.
	Registry registry.Registry
	Engine   *routing.Engine
	// Logger defaults to slog.Default(). Each request's log line carries its lane and trace
	// id (lanestrace.LogHandler).
	Logger *slog.Logger
	// Traces, when set, is the OTLP/gRPC address of the trace collector: each demo service then
	// traces its requests under its own name, and exports there.
	Traces string
	// TracesToken is the credential sent with the spans (the telemetry token of lanes up).
	TracesToken string
	// TracesTLS verifies an https:// Traces (nil: the system's roots).
	TracesTLS *tls.Config
}

// Topology is the running demo services.
type Topology struct {
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	clients   map[string]*http.Client // per calling service
	providers []*sdktrace.TracerProvider
	log       *slog.Logger

	mu   sync.Mutex
	errs []error
}

// Start starts every instance on a free loopback port, registers them, and
// waits until the engine sees them all (or ctx is done).
func Start(ctx context.Context, cfg Config) (*Topology, error) {
	if cfg.Registry == nil || cfg.Engine == nil {
		return nil, errors.New("demo: Config.Registry and Config.Engine are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := slog.New(lanestrace.LogHandler(cfg.Logger.Handler())).With("component", "demo")
	rctx, cancel := context.WithCancel(context.Background())
	t := &Topology{cancel: cancel, clients: map[string]*http.Client{}, log: log}
	noEnv := func(string) string { return "" } // the demo places its instances itself
	tps := map[string]trace.TracerProvider{}
	for _, in := range Instances {
		if _, ok := tps[in.Service]; ok {
			continue
		}
		var tp trace.TracerProvider
		if cfg.Traces != "" {
			sdk, err := traceexport.NewProvider(ctx, in.Service, cfg.Traces, lanestrace.Sampler(1), cfg.TracesToken, cfg.TracesTLS)
			if err != nil {
				t.Close()
				return nil, fmt.Errorf("demo: the trace exporter of %s: %w", in.Service, err)
			}
			t.providers = append(t.providers, sdk)
			tp = sdk
		}
		tps[in.Service] = tp
		t.clients[in.Service] = laneshttp.NewClient(cfg.Engine, laneshttp.WithTracerProvider(tp))
	}
	for _, in := range Instances {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("demo: %s/%s: %w", in.Service, in.ID, err)
		}
		srv := &http.Server{Handler: t.handler(in), ReadHeaderTimeout: 10 * time.Second}
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			err := laneshttp.Serve(rctx, srv, ln, cfg.Registry,
				registry.Instance{Service: in.Service, ID: in.ID, Lane: in.Lane, Version: "demo"},
				laneshttp.WithGuard(laneshttp.NewGuard(cfg.Engine)), laneshttp.WithEnv(noEnv), laneshttp.WithLogger(log),
				laneshttp.WithTracerProvider(tps[in.Service]),
				laneshttp.WithTTL(5*time.Second), laneshttp.WithShutdownTimeout(5*time.Second))
			if err != nil && rctx.Err() == nil {
				log.Error("demo instance stopped", "service", in.Service, "id", in.ID, "err", err)
				t.mu.Lock()
				t.errs = append(t.errs, err)
				t.mu.Unlock()
			}
		}()
	}
	// Wait until the engine routes to every instance.
	for {
		missing := ""
		for _, in := range Instances {
			if !slices.ContainsFunc(cfg.Engine.Service(in.Service).Instances(), func(r registry.Instance) bool { return r.ID == in.ID }) {
				missing = in.Service + "/" + in.ID
				break
			}
		}
		if missing == "" {
			return t, nil
		}
		if err := t.err(); err != nil {
			t.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
			t.Close()
			return nil, fmt.Errorf("demo: %s not registered: %w", missing, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (t *Topology) err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return errors.Join(t.errs...)
}

// Close stops every instance (each deregisters first) and waits for them.
func (t *Topology) Close() error {
	t.cancel()
	t.wg.Wait()
	for _, c := range t.clients {
		c.CloseIdleConnections()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, tp := range t.providers {
		tp.Shutdown(ctx) // flushes the last spans
	}
	return nil
}

// handler answers with this hop and the hops of the next service, called in
// the request's lane.
func (t *Topology) handler(in Instance) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.log.InfoContext(r.Context(), "demo request", "service", in.Service, "instance", in.ID, "path", r.URL.Path)
		res := Response{Hops: []Hop{{Service: in.Service, Instance: in.ID, Lane: in.Lane}}}
		status := http.StatusOK
		if in.Next != "" {
			next, err := t.call(r, in.Service, in.Next)
			res.Hops = append(res.Hops, next.Hops...)
			if err != nil {
				res.Error, status = err.Error(), http.StatusBadGateway
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(res.format())
	})
}

// call calls service from caller with the request's context, so in its lane.
func (t *Topology) call(r *http.Request, caller, service string) (Response, error) {
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, "http://"+service+"/", nil)
	if err != nil {
		return Response{}, err
	}
	resp, err := t.clients[caller].Do(req)
	if err != nil {
		return Response{}, fmt.Errorf("%s: %w", service, err)
	}
	defer resp.Body.Close()
	var out Response
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err := json.Unmarshal(body, &out); err != nil {
		return Response{}, fmt.Errorf("%s answered %s: %s", service, resp.Status, body)
	}
	if out.Error != "" {
		return out, errors.New(out.Error)
	}
	if resp.StatusCode != http.StatusOK {
		return out, fmt.Errorf("%s answered %s", service, resp.Status)
	}
	return out, nil
}

// format writes r as JSON with one hop per line, for reading in a terminal.
func (r Response) format() []byte {
	var b bytes.Buffer
	b.WriteString("{\"hops\": [")
	for i, h := range r.Hops {
		if i > 0 {
			b.WriteString(",")
		}
		hop, _ := json.Marshal(h)
		b.WriteString("\n  ")
		b.Write(hop)
	}
	b.WriteString("\n]")
	if r.Error != "" {
		e, _ := json.Marshal(r.Error)
		b.WriteString(", \"error\": ")
		b.Write(e)
	}
	b.WriteString("}\n")
	return b.Bytes()
}
