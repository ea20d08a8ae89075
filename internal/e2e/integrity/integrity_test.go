// Package integrity runs services that route with lanes and trace into the trace collector of
// lanes up, and checks the collector's lane integrity findings: none on a clean chain; a
// broken trace for a service that calls downstream with context.Background(); a lost lane for one
// that copies the lane wrong; a needless fallback for a caller whose view misses a live lane
// instance, and none past a lane instance that heartbeats but refuses connections, nor for a
// probe of a lane instance.
package integrity

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/app/collector"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/lanestrace"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const patience = 30 * time.Second

type world struct {
	t      *testing.T
	col    *collector.Collector
	reg    *registry.Memory
	engine *routing.Engine
	tps    map[string]*sdktrace.TracerProvider
	edge   *http.Client // the entry's client (the gateway's role)
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{t: t, reg: registry.NewMemory(), tps: map[string]*sdktrace.TracerProvider{}}
	store := policy.NewMemory()
	if _, err := store.Put(context.Background(), []byte("outlier: {errors: 1}\n")); err != nil {
		t.Fatal(err)
	}
	w.engine = routing.New(routing.WithRegistry(w.reg), routing.WithPolicyStore(store), routing.WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { w.engine.Close(); w.reg.Close() })
	<-w.engine.PolicyReady()
	col, err := collector.New(collector.Config{GRPCAddr: "127.0.0.1:0", Auth: collector.AuthLoopback, Logger: slog.New(slog.DiscardHandler),
		Fleet: collector.EngineFleet(w.engine, func(s string) bool { return s == "edge" })})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := col.Start(ctx); err != nil {
		t.Fatal(err)
	}
	w.col = col
	t.Cleanup(func() {
		for _, tp := range w.tps {
			tp.Shutdown(context.Background())
		}
		col.Close(context.Background())
	})
	w.edge = laneshttp.NewClient(w.engine, laneshttp.WithTracerProvider(w.provider("edge")), laneshttp.WithEnv(noEnv))
	t.Cleanup(w.edge.CloseIdleConnections)
	return w
}

func noEnv(string) string { return "" }

// provider is the tracer provider of service, exporting synchronously to the collector.
func (w *world) provider(service string) *sdktrace.TracerProvider {
	if tp := w.tps[service]; tp != nil {
		return tp
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(w.col.GRPCAddr().String()), otlptracegrpc.WithInsecure())
	if err != nil {
		w.t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName(service))))
	w.tps[service] = tp
	return tp
}

// instance serves h as an instance of service in lane l, traced, guarded, registered, and
// returns its address.
func (w *world) instance(service, id, l string, h func(client *http.Client) http.HandlerFunc) string {
	w.t.Helper()
	tp := w.provider(service)
	client := laneshttp.NewClient(w.engine, laneshttp.WithTracerProvider(tp), laneshttp.WithEnv(noEnv))
	w.t.Cleanup(client.CloseIdleConnections)
	inst := registry.Instance{Service: service, ID: id, Lane: l}
	g := laneshttp.NewGuard(w.engine)
	srv := httptest.NewUnstartedServer(laneshttp.Handler(h(client), laneshttp.WithGuard(g), laneshttp.WithTracerProvider(tp)))
	inst.Addr = srv.Listener.Addr().String()
	g.SetInstance(inst)
	srv.Start()
	w.t.Cleanup(srv.Close)
	w.register(inst)
	return inst.Addr
}

func (w *world) register(inst registry.Instance) {
	w.t.Helper()
	lease, err := w.reg.Register(context.Background(), inst, 0)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { lease.Close() })
	svc := w.engine.Service(inst.Service)
	deadline := time.Now().Add(patience)
	for !listed(svc, inst.ID) {
		if time.Now().After(deadline) {
			w.t.Fatalf("the engine does not list %s", inst.ID)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func listed(svc *routing.Service, id string) bool {
	for _, in := range svc.Instances() {
		if in.ID == id {
			return true
		}
	}
	return false
}

// leaf answers with its id.
func leaf(id string) func(*http.Client) http.HandlerFunc {
	return func(*http.Client) http.HandlerFunc {
		return func(rw http.ResponseWriter, r *http.Request) { io.WriteString(rw, id) }
	}
}

// caller calls next with the context that ctxOf makes of the request's, and answers with its
// answer.
func caller(next string, ctxOf func(r *http.Request) context.Context) func(*http.Client) http.HandlerFunc {
	return func(c *http.Client) http.HandlerFunc {
		return func(rw http.ResponseWriter, r *http.Request) {
			req, _ := http.NewRequestWithContext(ctxOf(r), http.MethodGet, "http://"+next+"/", nil)
			res, err := c.Do(req)
			if err != nil {
				http.Error(rw, err.Error(), http.StatusBadGateway)
				return
			}
			defer res.Body.Close()
			io.Copy(rw, res.Body)
		}
	}
}

// enter sends a request in lane l to service through the entry, as the gateway does, and returns
// its answer and trace id.
func (w *world) enter(service, l string) (string, string) {
	w.t.Helper()
	ctx, span := w.provider("edge").Tracer("edge").Start(lane.WithLane(context.Background(), l), "GET",
		trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(lanestrace.Entry.Bool(true), lanestrace.Requested.String(l)))
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+service+"/", nil)
	res, err := w.edge.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	span.End()
	return string(body), span.SpanContext().TraceID().String()
}

// findings waits until the collector has n findings, and returns them.
func (w *world) findings(n int) []adminapi.Finding {
	w.t.Helper()
	deadline := time.Now().Add(patience)
	for {
		fs := w.col.Findings(time.Time{}, "")
		if len(fs) >= n {
			return fs
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%d findings, want %d: %+v", len(fs), n, fs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// none checks that the collector, holding spans spans, has no finding.
func (w *world) none(spans int, what string) {
	w.t.Helper()
	if st := w.col.Stats(); st.Spans != spans {
		w.t.Fatalf("%d spans stored, want %d", st.Spans, spans)
	}
	if fs := w.col.Findings(time.Time{}, ""); len(fs) != 0 {
		w.t.Fatalf("findings %s: %+v", what, fs)
	}
}

func TestCleanChain(t *testing.T) {
	w := newWorld(t)
	w.instance("web", "web-1", "", caller("orders", (*http.Request).Context))
	w.instance("orders", "orders-1", "", caller("payments", (*http.Request).Context))
	w.instance("orders", "orders-alice", "alice", caller("payments", (*http.Request).Context))
	w.instance("payments", "payments-1", "", leaf("payments-1"))
	for _, l := range []string{"", "alice", "bob"} {
		if body, _ := w.enter("web", l); body != "payments-1" {
			t.Fatalf("lane %q: %q", l, body)
		}
	}
	// Every span has arrived (the exporters are synchronous): a clean chain has no finding.
	w.none(3*7, "on a clean chain")
}

func TestTraceBroken(t *testing.T) {
	w := newWorld(t)
	// web calls orders with context.Background(): the call carries neither the lane nor the trace.
	w.instance("web", "web-1", "", caller("orders", func(*http.Request) context.Context { return context.Background() }))
	w.instance("orders", "orders-1", "", leaf("orders-1"))
	w.instance("orders", "orders-alice", "alice", leaf("orders-alice"))
	body, id := w.enter("web", "alice")
	if body != "orders-1" {
		t.Fatalf("answer %q: the lane is lost, so the baseline serves", body)
	}
	f := w.findings(1)[0]
	if f.Kind != adminapi.FindingTraceBroken || f.Service != "web" || f.Span != "GET" || f.ParentTraceID != id ||
		!strings.Contains(f.Message, `web started a new trace with GET while serving GET in lane "alice"`) {
		t.Fatalf("finding %+v", f)
	}
}

func TestLaneLost(t *testing.T) {
	w := newWorld(t)
	// web copies the lane wrong.
	w.instance("web", "web-1", "", caller("orders", func(r *http.Request) context.Context { return lane.WithLane(r.Context(), "alic") }))
	w.instance("orders", "orders-1", "", leaf("orders-1"))
	w.instance("orders", "orders-alice", "alice", leaf("orders-alice"))
	_, id := w.enter("web", "alice")
	fs := w.findings(1)
	if f := fs[0]; f.Kind != adminapi.FindingLaneLost || f.Service != "web" || f.TraceID != id ||
		!strings.Contains(f.Message, `GET carries lane "alic" but its parent GET (web) carries "alice"`) {
		t.Fatalf("finding %+v", fs)
	}
}

// TestRefusedIsNoNeedlessFallback: a lane instance that heartbeats but refuses connections (killed
// with kill -9 while its lease runs) is ejected by its first refusal, and its lane's requests fall
// back to the baseline: the routing working, no finding.
func TestRefusedIsNoNeedlessFallback(t *testing.T) {
	w := newWorld(t)
	w.instance("web", "web-1", "", caller("orders", (*http.Request).Context))
	w.instance("orders", "orders-1", "", leaf("orders-1"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	w.register(registry.Instance{Service: "orders", ID: "orders-alice", Lane: "alice", Addr: addr})
	for i := 0; i < 10; i++ {
		if body, _ := w.enter("web", "alice"); body != "orders-1" {
			t.Fatalf("answer %q, want the baseline's after the refused connection", body)
		}
	}
	// Every span has arrived (the exporters are synchronous).
	w.none(10*5, "after a refused connection")
}

// TestNeedlessFallback: a caller whose engine does not see the lane instance that the registry
// lists (a stale view) falls back needlessly.
func TestNeedlessFallback(t *testing.T) {
	w := newWorld(t)
	stale := routing.New(routing.WithLogger(slog.New(slog.DiscardHandler))) // told its instances below
	t.Cleanup(func() { stale.Close() })
	w.instance("orders", "orders-1", "", leaf("orders-1"))
	w.instance("orders", "orders-alice", "alice", leaf("orders-alice"))
	for _, in := range w.engine.Service("orders").Instances() {
		if in.ID == "orders-1" {
			stale.SetInstances("orders", []registry.Instance{in})
		}
	}
	web := laneshttp.NewClient(stale, laneshttp.WithTracerProvider(w.provider("web")), laneshttp.WithEnv(noEnv))
	t.Cleanup(web.CloseIdleConnections)
	ctx, span := w.provider("web").Tracer("web").Start(lane.WithLane(context.Background(), "alice"), "GET",
		trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(lanestrace.Entry.Bool(true), lanestrace.Requested.String("alice")))
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://orders/", nil)
	res, err := web.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	span.End()
	if string(body) != "orders-1" {
		t.Fatalf("answer %q, want the baseline's", body)
	}
	fs := w.findings(1)
	if f := fs[0]; f.Kind != adminapi.FindingNeedlessFallback || f.Service != "web" || f.TraceID != span.SpanContext().TraceID().String() ||
		!strings.Contains(f.Message, `although orders has a live instance in "alice"`) {
		t.Fatalf("finding %+v", fs)
	}
}

// TestProbeOfLaneInstance: a health probe or a metrics scrape of a lane instance carries no lane;
// the guard serves it (an exempt path), and the checks do not take it for baseline traffic that
// reached a lane instance.
func TestProbeOfLaneInstance(t *testing.T) {
	w := newWorld(t)
	addr := w.instance("orders", "orders-alice", "alice", leaf("orders-alice"))
	hc := &http.Client{Timeout: patience}
	for _, path := range []string{"/_healthz", "/readyz", "/metrics", "/"} {
		res, err := hc.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if want := path != "/"; (res.StatusCode == http.StatusOK) != want {
			t.Fatalf("GET %s of a lane instance, no lane: %s", path, res.Status)
		}
	}
	// The spans end after the answers: wait for all four.
	deadline := time.Now().Add(patience)
	for w.col.Stats().Spans < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("%d spans stored, want 4", w.col.Stats().Spans)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if fs := w.col.Findings(time.Time{}, ""); len(fs) != 0 {
		t.Fatalf("findings on probes of a lane instance: %+v", fs)
	}
}
