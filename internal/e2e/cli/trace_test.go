package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/testkit/childproc"
	"github.com/lanesdev/lanes/lanestrace"
)

// tracerFor is an OpenTelemetry SDK tracer provider of service that exports synchronously to the
// collector of u with its telemetry token, as a service started with LANES_TRACES and
// LANES_TRACES_TOKEN would.
func tracerFor(t *testing.T, u *up, service string) trace.Tracer {
	t.Helper()
	return tracerWith(t, u, service, u.telemetryToken(t))
}

// telemetryToken reads the telemetry token that lanes up keeps in its data directory.
func (u *up) telemetryToken(t *testing.T) string {
	t.Helper()
	tok, err := os.ReadFile(filepath.Join(u.dataDir, "telemetry-token"))
	if err != nil {
		t.Fatalf("telemetry token: %v", err)
	}
	return strings.TrimSpace(string(tok))
}

// tracerWith is tracerFor with token ("" sends none).
func tracerWith(t *testing.T, u *up, service, token string) trace.Tracer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(u.traces), otlptracegrpc.WithInsecure()}
	if token != "" {
		opts = append(opts, otlptracegrpc.WithHeaders(map[string]string{"authorization": "Bearer " + token}))
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName(service))))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp.Tracer("e2e")
}

// TestTrace sends the spans of a request whose lane a service dropped to the collector of lanes
// up, and reads them back with lanes trace.
func TestTrace(t *testing.T) {
	u := startUp(t, "up")
	if u.traces == "" {
		t.Fatalf("lanes up printed no traces address:\n%s", u.Stdout.String())
	}
	if !strings.Contains(u.Stdout.String(), "LANES_TRACES="+u.traces) {
		t.Errorf("lanes up does not print the LANES_TRACES export line:\n%s", u.Stdout.String())
	}
	web, orders := tracerFor(t, u, "web"), tracerFor(t, u, "orders")
	ctx, s1 := web.Start(context.Background(), "GET /checkout", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(lanestrace.Requested.String("alice"), lanestrace.InstanceLane.String("")))
	ctx, c1 := web.Start(ctx, "orders.Place", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(lanestrace.Requested.String(""), lanestrace.Served.String(""), lanestrace.Service.String("orders"),
			lanestrace.FallbackReason.String(lanestrace.ReasonNone), lanestrace.InstanceID.String("orders-1"), lanestrace.Eligible.Int(1)))
	_, s2 := orders.Start(ctx, "orders.Place", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(lanestrace.Requested.String(""), lanestrace.InstanceLane.String("")))
	s2.End()
	c1.End()
	s1.End()
	id := s1.SpanContext().TraceID().String()
	admin := []string{"--admin", u.admin, "--token", u.token}

	code, out, errOut := run(t, "", append([]string{"trace", id}, admin...)...)
	if code != 0 {
		t.Fatalf("lanes trace: exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"trace " + id + ": 3 hops",
		"web  GET /checkout  lane alice, served by (baseline)",
		"└─ web → orders  orders.Place  lane (baseline) → (baseline)  instance orders-1",
		`! lane_lost: orders.Place carries lane "" but its parent GET /checkout (web) carries "alice"`,
		"└─ orders  orders.Place  lane (baseline), served by (baseline)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("lanes trace output lacks %q:\n%s", want, out)
		}
	}

	code, out, errOut = run(t, "", append([]string{"trace", id, "-o", "json"}, admin...)...)
	var tr adminapi.Trace
	if code != 0 || json.Unmarshal([]byte(out), &tr) != nil {
		t.Fatalf("lanes trace -o json: exit %d, %s\n%s", code, errOut, out)
	}
	if len(tr.Hops) != 3 || tr.Hops[1].Depth != 1 || tr.Hops[1].Instance != "orders-1" || len(tr.Hops[1].Findings) != 1 || tr.Hops[1].Findings[0].Kind != "lane_lost" {
		t.Errorf("hops: %+v", tr.Hops)
	}

	code, out, _ = run(t, "", append([]string{"trace", "--last", "5", "--lane", "alice"}, admin...)...)
	if code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "GET /checkout") {
		t.Errorf("lanes trace --last: exit %d:\n%s", code, out)
	}
	code, out, _ = run(t, "", append([]string{"trace", "--lane", "bob"}, admin...)...)
	if code != 0 || strings.Contains(out, id) {
		t.Errorf("lanes trace --lane bob lists the alice trace: exit %d:\n%s", code, out)
	}
	code, out, _ = run(t, "", append([]string{"trace", "findings"}, admin...)...)
	if code != 0 || !strings.Contains(out, "lane_lost") || !strings.Contains(out, id) {
		t.Errorf("lanes trace findings: exit %d:\n%s", code, out)
	}

	code, _, errOut = run(t, "", append([]string{"trace", strings.Repeat("ab", 16)}, admin...)...)
	if code != 1 || !strings.Contains(errOut, "no trace abababababababababababababababab") {
		t.Errorf("unknown trace: exit %d, %s", code, errOut)
	}
	code, _, errOut = run(t, "", append([]string{"trace", "xyz"}, admin...)...)
	if code != 2 || !strings.Contains(errOut, `trace id "xyz": want 32 hex digits`) {
		t.Errorf("bad trace id: exit %d, %s", code, errOut)
	}
}

// TestDemoTrace follows a request through lanes demo by the trace id that the gateway answers
// with: lanes trace shows gateway → web → orders → payments with the lanes requested and served,
// and the demo services' log lines of that request carry the same trace id.
func TestDemoTrace(t *testing.T) {
	u := startUp(t, "demo", "--log-level", "info", "--log-format", "json")
	c := clientFrom(t, "127.0.0.1")
	req, _ := http.NewRequest(http.MethodGet, u.gateway+"/", nil)
	req.Header.Set("x-lane", "alice")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	id := resp.Header.Get("X-Trace-Id")
	tr := resp.Header.Get("Traceresponse")
	if len(id) != 32 || !strings.HasPrefix(tr, "00-"+id+"-") || !strings.HasSuffix(tr, "-01") {
		t.Fatalf("x-trace-id %q, traceresponse %q", id, tr)
	}
	admin := []string{"--admin", u.admin, "--token", u.token}
	// Each process exports its spans on its own: wait for all of them, the server span of every
	// hop and the three calls.
	var got adminapi.Trace
	eventually(t, "the whole trace in the collector", func() string {
		code, out, errOut := run(t, "", append([]string{"trace", id, "-o", "json"}, admin...)...)
		if code != 0 {
			return fmt.Sprintf("lanes trace: exit %d: %s", code, errOut)
		}
		got = adminapi.Trace{}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			return err.Error()
		}
		for _, s := range []string{"lanes-gateway", "web", "orders", "payments"} {
			if servedBy(got, s) == nil {
				return "no server span of " + s
			}
		}
		if n := len(slices.DeleteFunc(slices.Clone(got.Hops), func(h adminapi.Hop) bool { return h.Kind != "client" })); n < 3 {
			return fmt.Sprintf("%d client spans of 3", n)
		}
		return ""
	})
	for _, want := range []struct{ service, instanceLane string }{{"web", ""}, {"orders", ""}, {"payments", "alice"}} {
		h := servedBy(got, want.service)
		if h == nil || h.Requested != "alice" || h.Served != want.instanceLane {
			t.Errorf("%s: %+v", want.service, h)
		}
	}
	var calls []string
	for _, h := range got.Hops {
		if h.Kind == "client" {
			calls = append(calls, h.Service+"→"+h.Callee+":"+h.Served+"/"+h.Reason)
		}
	}
	if want := "lanes-gateway→web:/no_instance_in_lane web→orders:/no_instance_in_lane orders→payments:alice/none"; strings.Join(calls, " ") != want {
		t.Errorf("calls %q, want %q", strings.Join(calls, " "), want)
	}
	if len(got.Findings) != 0 {
		t.Errorf("a clean demo request has findings: %+v", got.Findings)
	}
	code, out, _ := run(t, "", append([]string{"trace", id}, admin...)...)
	if code != 0 || !strings.Contains(out, "orders → payments  GET  lane alice → alice  instance payments-alice") {
		t.Errorf("lanes trace:\n%s", out)
	}
	// The log lines of the request carry its trace id.
	logged := 0
	for _, l := range strings.Split(u.Stderr.String(), "\n") {
		if strings.Contains(l, `"msg":"demo request"`) && strings.Contains(l, `"trace_id":"`+id+`"`) && strings.Contains(l, `"lane":"alice"`) {
			logged++
		}
	}
	if logged != 3 {
		t.Errorf("%d log lines of the demo services carry trace id %s, want 3:\n%s", logged, id, childproc.Tail(u.Stderr.String(), 4000))
	}
}

func servedBy(t adminapi.Trace, service string) *adminapi.Hop {
	for i, h := range t.Hops {
		if h.Kind == "server" && h.Service == service {
			return &t.Hops[i]
		}
	}
	return nil
}
