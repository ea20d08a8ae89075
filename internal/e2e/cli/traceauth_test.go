package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/lanestrace"
)

// otlpServerSpan is an export request of one server span of service: a request in lane
// requested served by an instance of lane own. Each call makes a new trace.
func otlpServerSpan(service, requested, own string, n int) *coltracepb.ExportTraceServiceRequest {
	str := func(k, v string) *commonpb.KeyValue {
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
	}
	tid := []byte(fmt.Sprintf("%016d", n))
	now := uint64(time.Now().UnixNano())
	return &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource: &resourcepb.Resource{Attributes: []*commonpb.KeyValue{str("service.name", service)}},
		ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{{
			TraceId: tid, SpanId: tid[8:], Name: "GET /", Kind: tracepb.Span_SPAN_KIND_SERVER,
			StartTimeUnixNano: now, EndTimeUnixNano: now + 1000,
			Attributes: []*commonpb.KeyValue{str(string(lanestrace.Requested), requested), str(string(lanestrace.InstanceLane), own)},
		}}}},
	}}}
}

var otlpHTTPAddr = regexp.MustCompile(`OTLP/HTTP on (\S+?);`)

// TestTraceReceiverAuth sends spans to the trace collector of lanes up, as a process, over
// OTLP/gRPC and OTLP/HTTP: without a token, or with an unknown one, they are refused; a lane
// token sends the spans of its own lane's instances and no others; the telemetry token sends any.
// So nobody without a credential forges a breach, and a lane token forges none for another lane.
func TestTraceReceiverAuth(t *testing.T) {
	u := startUp(t, "up")
	out := u.Stdout.String()
	telemetry := u.telemetryToken(t)
	if fi, err := os.Stat(filepath.Join(u.dataDir, "telemetry-token")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("telemetry-token: %v, want mode 0600", err)
	}
	if !strings.Contains(out, `LANES_TRACES_TOKEN="$(cat `) || strings.Contains(out, telemetry) {
		t.Errorf("lanes up does not print how to read the telemetry token, or prints the token:\n%s", out)
	}
	m := otlpHTTPAddr.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no OTLP/HTTP address in:\n%s", out)
	}
	httpAddr := m[1]
	alice := u.newToken(t, adminapi.TokenRequest{Lane: "alice"})

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	conn, err := grpc.NewClient(u.traces, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := coltracepb.NewTraceServiceClient(conn)
	n := 0
	grpcExport := func(token, service, requested, own string) (*coltracepb.ExportTraceServiceResponse, error) {
		n++
		cctx := ctx
		if token != "" {
			cctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		}
		return client.Export(cctx, otlpServerSpan(service, requested, own, n))
	}
	httpExport := func(token, service, requested, own string) (int, string) {
		n++
		body, _ := proto.Marshal(otlpServerSpan(service, requested, own, n))
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+httpAddr+"/v1/traces", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/x-protobuf")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	// No token, and an unknown one: refused on both receivers.
	for _, tok := range []string{"", "lanes_0123456789ab_" + strings.Repeat("0", 64)} {
		if _, err := grpcExport(tok, "payments", "", "bob"); status.Code(err) != codes.Unauthenticated {
			t.Errorf("OTLP/gRPC with token %q: %v, want Unauthenticated", tok, err)
		}
		if code, body := httpExport(tok, "payments", "", "bob"); code != http.StatusUnauthorized {
			t.Errorf("OTLP/HTTP with token %q: %d %s, want 401", tok, code, body)
		}
	}
	// alice's token: a span of an instance of bob, or of the baseline, is refused...
	for _, own := range []string{"bob", ""} {
		resp, err := grpcExport(alice, "payments", "", own)
		if err != nil || resp.GetPartialSuccess().GetRejectedSpans() != 1 || !strings.Contains(resp.GetPartialSuccess().GetErrorMessage(), "may not send") {
			t.Errorf("alice's token sending a span of an instance of %q: %v, %v; want it rejected", own, resp, err)
		}
	}
	if code, body := httpExport(alice, "payments", "", "bob"); code != http.StatusOK || !strings.Contains(body, "may not send") {
		t.Errorf("alice's token sending a span of bob over OTLP/HTTP: %d %s, want it rejected", code, body)
	}
	// ... and one of its own instance is taken: a baseline request served by alice's instance
	// is alice's own breach to report.
	if resp, err := grpcExport(alice, "web", "", "alice"); err != nil || resp.GetPartialSuccess() != nil {
		t.Errorf("alice's token sending its own span: %v, %v", resp, err)
	}
	// The telemetry token sends any span.
	if resp, err := grpcExport(telemetry, "orders", "", "carol"); err != nil || resp.GetPartialSuccess() != nil {
		t.Errorf("the telemetry token: %v, %v", resp, err)
	}
	if code, body := httpExport(telemetry, "orders", "", "dave"); code != http.StatusOK || strings.Contains(body, "rejected") {
		t.Errorf("the telemetry token over OTLP/HTTP: %d %s", code, body)
	}

	findings, err := u.client(t, u.token).Findings(ctx, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range findings {
		got = append(got, f.Kind+" "+f.Service)
	}
	if strings.Join(got, ",") != "breach orders,breach orders,breach web" {
		t.Errorf("findings %v, want the breaches of web (alice's token) and orders (the telemetry token) only", got)
	}
	list, err := u.client(t, u.token).Traces(ctx, adminclient.TraceFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if list.Stats.Refused != 3 {
		t.Errorf("stats: %d spans refused, want 3", list.Stats.Refused)
	}
}

// TestTraceMetricsLabelLimit forges breaches under 20,000 service names with the telemetry
// token: /metrics of lanes up keeps its size, since the service label of
// lanes_integrity_findings_total is bounded.
func TestTraceMetricsLabelLimit(t *testing.T) {
	u := startUp(t, "up")
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	metricsSize := func() int {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u.admin+"/metrics", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return len(b)
	}
	before := metricsSize()
	conn, err := grpc.NewClient(u.traces, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := coltracepb.NewTraceServiceClient(conn)
	tctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+u.telemetryToken(t))
	const services = 20_000
	for batch := range services / 1000 {
		req := &coltracepb.ExportTraceServiceRequest{}
		for i := range 1000 {
			n := batch*1000 + i
			req.ResourceSpans = append(req.ResourceSpans, otlpServerSpan(fmt.Sprintf("forged-%05d", n), "", "x", n+1).ResourceSpans...)
		}
		if resp, err := client.Export(tctx, req); err != nil || resp.GetPartialSuccess() != nil {
			t.Fatalf("export: %v, %v", resp, err)
		}
	}
	after := metricsSize()
	t.Logf("/metrics: %d bytes before, %d after %d forged service names", before, after, services)
	if after > before+64<<10 {
		t.Errorf("/metrics grew from %d to %d bytes", before, after)
	}
}
