package lanestrace_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/lanesdev/lanes/internal/lib/traceexport"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanestrace"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSampler(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(lanestrace.Sampler(0)), sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	tr := tp.Tracer("test")

	_, base := tr.Start(context.Background(), "baseline entry")
	if base.SpanContext().IsSampled() {
		t.Error("a baseline entry is sampled at ratio 0")
	}
	ctx, entry := tr.Start(lane.WithLane(context.Background(), "alice"), "lane entry")
	if !entry.SpanContext().IsSampled() {
		t.Fatal("a lane entry is not sampled")
	}
	// Downstream, the entry's decision holds, whatever the lane of the child's context.
	_, child := tr.Start(lane.WithLane(ctx, ""), "child")
	if !child.SpanContext().IsSampled() {
		t.Error("the child of a sampled entry is not sampled")
	}
	bctx, _ := tr.Start(context.Background(), "baseline entry 2")
	_, laneChild := tr.Start(lane.WithLane(bctx, "alice"), "lane child of an unsampled entry")
	if laneChild.SpanContext().IsSampled() {
		t.Error("a child must follow its entry's decision")
	}
	if got := lanestrace.Sampler(0.25).Description(); !strings.Contains(got, "baseline: 0.25") {
		t.Errorf("description %q", got)
	}

	all := sdktrace.NewTracerProvider(sdktrace.WithSampler(lanestrace.Sampler(1)))
	defer all.Shutdown(context.Background())
	if _, s := all.Tracer("t").Start(context.Background(), "x"); !s.SpanContext().IsSampled() {
		t.Error("a baseline entry is not sampled at ratio 1")
	}
}

func TestLogHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(lanestrace.LogHandler(slog.NewTextHandler(&buf, nil))).With("service", "web")
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("t").Start(lane.WithLane(context.Background(), "alice"), "GET /")
	log.InfoContext(ctx, "order placed", "order", 7)
	log.Info("no context")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := "service=web order=7 lane=alice trace_id=" + span.SpanContext().TraceID().String() + " span_id=" + span.SpanContext().SpanID().String()
	if len(lines) != 2 || !strings.HasSuffix(lines[0], want) {
		t.Fatalf("got:\n%s\nwant a first line ending in %q", buf.String(), want)
	}
	if strings.Contains(lines[1], "trace_id") || strings.Contains(lines[1], "lane=") {
		t.Errorf("a record without a context carries request fields: %s", lines[1])
	}
}

// receiver is an OTLP/gRPC trace service that counts the spans it gets.
type receiver struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	names []string
	auth  []string // the authorization metadata of each request
	got   chan struct{}
}

func (r *receiver) Export(ctx context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	r.auth = append(r.auth, strings.Join(metadata.ValueFromIncomingContext(ctx, "authorization"), ","))
	for _, rs := range req.GetResourceSpans() {
		var svc string
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				svc = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.names = append(r.names, svc+":"+s.GetName())
			}
		}
	}
	r.mu.Unlock()
	select {
	case r.got <- struct{}{}:
	default:
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// startReceiver serves a receiver over OTLP/gRPC on loopback until the test ends.
func startReceiver(t *testing.T) (*receiver, net.Listener) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	rec := &receiver{got: make(chan struct{}, 1)}
	coltracepb.RegisterTraceServiceServer(srv, rec)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return rec, lis
}

func TestFromEnv(t *testing.T) {
	rec, lis := startReceiver(t)

	env := map[string]string{lanestrace.EnvTraces: lis.Addr().String()}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, err := lanestrace.FromEnv(ctx, "orders", func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	defer lanestrace.SetTracerProvider(nil)
	if lanestrace.Tracer(nil) == nil {
		t.Fatal("FromEnv did not set the transports' tracer provider")
	}
	_, span := tr.Provider.Tracer("t").Start(lane.WithLane(ctx, "alice"), "orders.Get", trace.WithSpanKind(trace.SpanKindServer))
	span.End()
	if err := tr.Shutdown(ctx); err != nil { // flushes
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if strings.Join(rec.names, ",") != "orders:orders.Get" {
		t.Fatalf("the collector got %v", rec.names)
	}
}

// TestFromEnvToken: FromEnv sends LANES_TRACES_TOKEN, else the service's LANES_TOKEN, to the
// collector of LANES_TRACES as "Authorization: Bearer <token>", and traceexport.NewProvider sends
// the token it is given.
func TestFromEnvToken(t *testing.T) {
	rec, lis := startReceiver(t)
	defer lanestrace.SetTracerProvider(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	send := func(tp trace.TracerProvider, shutdown func(context.Context) error) {
		t.Helper()
		_, span := tp.Tracer("t").Start(ctx, "x")
		span.End()
		if err := shutdown(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, env := range []map[string]string{
		{lanestrace.EnvToken: "lanes_aaaaaaaaaaaa_1"},
		{lanestrace.EnvToken: "lanes_aaaaaaaaaaaa_1", lanestrace.EnvTracesToken: "lanes_telemetry_2"},
		{},
	} {
		env[lanestrace.EnvTraces] = lis.Addr().String()
		tr, err := lanestrace.FromEnv(ctx, "orders", func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		send(tr.Provider, tr.Shutdown)
	}
	tp, err := traceexport.NewProvider(ctx, "gateway", lis.Addr().String(), lanestrace.Sampler(1), "lanes_telemetry_3", nil)
	if err != nil {
		t.Fatal(err)
	}
	send(tp, tp.Shutdown)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	want := "Bearer lanes_aaaaaaaaaaaa_1|Bearer lanes_telemetry_2||Bearer lanes_telemetry_3"
	if got := strings.Join(rec.auth, "|"); got != want {
		t.Fatalf("authorization headers %q, want %q", got, want)
	}
}

func TestFromEnvOffAndBad(t *testing.T) {
	ctx := context.Background()
	for _, env := range []map[string]string{{}, {lanestrace.EnvTraces: "off", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}} {
		tr, err := lanestrace.FromEnv(ctx, "x", func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		if _, s := tr.Provider.Tracer("t").Start(ctx, "x"); s.SpanContext().IsValid() {
			t.Errorf("%v: tracing is on", env)
		}
	}
	for env, want := range map[[2]string]string{
		{lanestrace.EnvSample, "2"}:         `LANES_TRACE_SAMPLE="2": want a number from 0 to 1`,
		{lanestrace.EnvSample, "most"}:      `LANES_TRACE_SAMPLE="most"`,
		{lanestrace.EnvTraces, "nohost"}:    `LANES_TRACES="nohost": want host:port or an http(s):// URL`,
		{lanestrace.EnvTraces, "10.0.0.1:"}: `LANES_TRACES="10.0.0.1:"`,
	} {
		_, err := lanestrace.FromEnv(ctx, "x", func(k string) string {
			if k == env[0] {
				return env[1]
			}
			return ""
		})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s=%s: %v, want %q", env[0], env[1], err, want)
		}
	}
}
