package collector

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/lanesdev/lanes/lanesmetrics"
	"github.com/lanesdev/lanes/lanestrace"
)

// forged makes OTLP spans as an attacker would: every span in a trace of its own, with fresh ids.
type forged struct{ n atomic.Uint64 }

func (f *forged) ids() (trace, span []byte) {
	n := f.n.Add(1)
	trace, span = make([]byte, 16), make([]byte, 8)
	binary.BigEndian.PutUint64(trace[8:], n)
	trace[0] = 0xf0
	binary.BigEndian.PutUint64(span, n)
	return trace, span
}

func strAttr(k, v string) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
}

// span is one forged span of kind k named name, with attrs, started now.
func (f *forged) span(k tracepb.Span_SpanKind, name string, attrs ...*commonpb.KeyValue) *tracepb.Span {
	tid, sid := f.ids()
	now := uint64(time.Now().UnixNano())
	return &tracepb.Span{TraceId: tid, SpanId: sid, Name: name, Kind: k, StartTimeUnixNano: now, EndTimeUnixNano: now + uint64(time.Second), Attributes: attrs}
}

// request puts spans of service into one export request.
func request(service string, spans ...*tracepb.Span) *coltracepb.ExportTraceServiceRequest {
	return &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource:   &resourcepb.Resource{Attributes: []*commonpb.KeyValue{strAttr("service.name", service)}},
		ScopeSpans: []*tracepb.ScopeSpans{{Spans: spans}},
	}}}
}

func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestSpanFlood floods a collector, over OTLP/gRPC and OTLP/HTTP, with what grew its heap without
// limit: root client spans of services that are not entry points (which the trace_broken check
// remembers) with 1 MiB names, lane requests served and forged breaches with 1 MiB names, from
// 800 spans of one service and 20,000 forged service names. What the collector charges stays
// within its bounds, and so does the heap it holds after a GC.
func TestSpanFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("sends about 1 GiB of spans")
	}
	// Under the race detector, a tenth of the flood against bounds of 1 MiB: the race
	// detector's own memory and time grow with what is sent.
	if raceEnabled {
		spanFlood(t, 1<<20, 1<<20, 10)
		return
	}
	for _, b := range []struct {
		name         string
		store, check int64
	}{{"8 MiB", 8 << 20, 8 << 20}, {"defaults", DefaultLimits.MaxBytes, DefaultLimits.MaxCheckBytes}} {
		t.Run(b.name, func(t *testing.T) { spanFlood(t, b.store, b.check, 1) })
	}
}

// spanFlood sends the flood, divided by div, to a collector with the bounds given.
func spanFlood(t *testing.T, storeBound, checkBound int64, div int) {
	before := heapAfterGC()
	reg := prometheus.NewRegistry()
	c := start(t, Config{Fleet: &fleet{}, Registerer: reg, Limits: Limits{MaxBytes: storeBound, MaxCheckBytes: checkBound}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	conn, err := grpc.NewClient(c.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(maxRequestBytes)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := coltracepb.NewTraceServiceClient(conn)
	var f forged
	huge := strings.Repeat("x", 1<<20)
	var sent, sentBytes int64
	export := func(req *coltracepb.ExportTraceServiceRequest, overHTTP bool) {
		t.Helper()
		n := 0
		for _, rs := range req.ResourceSpans {
			n += len(rs.ScopeSpans[0].Spans)
		}
		sent += int64(n)
		sentBytes += int64(proto.Size(req))
		if !overHTTP {
			if _, err := client.Export(ctx, req); err != nil {
				t.Fatal(err)
			}
			return
		}
		body, _ := proto.Marshal(req)
		r, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.HTTPAddr().String()+"/v1/traces", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/x-protobuf")
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("OTLP/HTTP: %s", resp.Status)
		}
	}
	// 800 spans with 1 MiB names from one service, 8 a request: roots, lane requests served, and
	// breaches.
	for i := range 100 / div {
		var spans []*tracepb.Span
		for range 3 {
			spans = append(spans, f.span(tracepb.Span_SPAN_KIND_CLIENT, huge))
		}
		for range 3 {
			spans = append(spans, f.span(tracepb.Span_SPAN_KIND_SERVER, huge, strAttr(string(lanestrace.Requested), "alice")))
		}
		for range 2 {
			spans = append(spans, f.span(tracepb.Span_SPAN_KIND_SERVER, huge, strAttr(string(lanestrace.Requested), ""),
				strAttr(string(lanestrace.InstanceLane), huge)))
		}
		export(request("web", spans...), i%4 == 3)
	}
	// 20,000 forged service names (of 1 KiB and more), each with a root and a breach.
	for i := range 200 / div {
		req := &coltracepb.ExportTraceServiceRequest{}
		for j := range 100 {
			service := fmt.Sprintf("%s-%d-%d", huge[:1000+j], i, j)
			req.ResourceSpans = append(req.ResourceSpans, request(service,
				f.span(tracepb.Span_SPAN_KIND_CLIENT, "call"),
				f.span(tracepb.Span_SPAN_KIND_SERVER, "GET /", strAttr(string(lanestrace.Requested), ""), strAttr(string(lanestrace.InstanceLane), "x")),
			).ResourceSpans...)
		}
		export(req, i%4 == 3)
	}
	conn.Close()

	st := c.Stats()
	held := int64(heapAfterGC()) - int64(before)
	checkBytes := st.Checks.FindingBytes + st.Checks.StateBytes
	t.Logf("sent %d spans in %d MiB; store: %d spans, %d of %d bytes, dropped %d spans; checks: %d findings, %d + %d of %d bytes, %d services, dropped %d findings and %d remembered spans; %d values cut to %d bytes; heap held after GC: %.1f MiB for bounds of %d MiB",
		sent, sentBytes>>20, st.Spans, st.Bytes, st.MaxBytes, st.Dropped.Spans, st.Checks.Findings, st.Checks.FindingBytes, st.Checks.StateBytes,
		st.Checks.MaxBytes, st.Checks.Services, st.Dropped.Findings, st.Dropped.CheckState, st.Truncated, st.MaxValueBytes,
		float64(held)/(1<<20), (storeBound+checkBound)>>20)
	if st.Bytes > storeBound {
		t.Errorf("the store charges %d bytes, over its bound %d", st.Bytes, storeBound)
	}
	if checkBytes > checkBound {
		t.Errorf("the checks charge %d bytes, over their bound %d", checkBytes, checkBound)
	}
	if st.Truncated == 0 || st.Dropped.Spans == 0 || st.Dropped.Findings == 0 || st.Dropped.CheckState == 0 {
		t.Errorf("the stats do not report what was cut and dropped: %+v", st)
	}
	// The bounds, and a margin for the receivers' buffers and the runtime's own.
	if limit := storeBound + checkBound + 8<<20; held > limit {
		t.Errorf("the collector holds %d bytes of heap after GC, over %d", held, limit)
	}
	// The findings' service label: the first services, then "other", for each of the 4 kinds.
	if n, max := testutil.CollectAndCount(c.checker.counter.vec), 4*(lanesmetrics.MaxServices+1); n > max {
		t.Errorf("lanes_integrity_findings_total has %d series, want at most %d", n, max)
	}
	runtime.KeepAlive(c)
}

// TestFindingsMetricLabelLimit forges breaches under 20,000 service names: the service label of
// lanes_integrity_findings_total takes the first lanesmetrics.MaxServices and counts the rest as
// "other", so the exposition stays small, and every finding is still counted.
func TestFindingsMetricLabelLimit(t *testing.T) {
	reg := prometheus.NewRegistry()
	c, err := New(Config{Registerer: reg, Fleet: &fleet{}})
	if err != nil {
		t.Fatal(err)
	}
	var f forged
	const services = 20_000
	for i := range services {
		c.Ingest(request(fmt.Sprintf("forged-%05d", i), f.span(tracepb.Span_SPAN_KIND_SERVER, "GET /",
			strAttr(string(lanestrace.Requested), ""), strAttr(string(lanestrace.InstanceLane), "x"))))
	}
	if n := testutil.CollectAndCount(c.checker.counter.vec); n != lanesmetrics.MaxServices+1 {
		t.Errorf("lanes_integrity_findings_total has %d series, want %d", n, lanesmetrics.MaxServices+1)
	}
	if got := testutil.ToFloat64(c.checker.counter.vec.WithLabelValues(Breach, lanesmetrics.Other)); got != services-lanesmetrics.MaxServices {
		t.Errorf("other: %v, want %d", got, services-lanesmetrics.MaxServices)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var size int
	for _, mf := range mfs {
		size += len(mf.String())
	}
	t.Logf("%d forged service names: the collector's metrics take %d bytes", services, size)
	if size > 64<<10 {
		t.Errorf("the collector's metrics take %d bytes", size)
	}
}
