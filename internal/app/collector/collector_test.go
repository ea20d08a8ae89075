package collector

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/lanestrace"
)

// TestReceive sends a three-hop trace from three services, over OTLP/gRPC and OTLP/HTTP, and
// reads it back as a tree.
func TestReceive(t *testing.T) {
	c := start(t, Config{})
	gw := provider(t, c, "gateway", false)
	web := provider(t, c, "web", true)

	ctx, entry := hop(context.Background(), gw, "GET /", trace.SpanKindServer,
		lanestrace.Entry.Bool(true), lanestrace.Requested.String("alice"))
	ctx, call := hop(ctx, gw, "web", trace.SpanKindClient, lanestrace.Requested.String("alice"), lanestrace.Served.String(""),
		lanestrace.FallbackReason.String(lanestrace.ReasonNoInstanceInLane), lanestrace.Service.String("web"),
		lanestrace.InstanceID.String("web-1"), lanestrace.InstanceAddr.String("127.0.0.1:9001"), lanestrace.Eligible.Int(2))
	_, srv := hop(ctx, web, "GET /", trace.SpanKindServer, lanestrace.Requested.String("alice"), lanestrace.InstanceLane.String(""))
	srv.SetStatus(codes.Error, "boom")
	srv.End()
	call.End()
	entry.End()

	id := entry.SpanContext().TraceID().String()
	spans := c.Store().Trace(id)
	if len(spans) != 3 {
		t.Fatalf("stored %d spans of trace %s, want 3", len(spans), id)
	}
	var got []string
	for _, h := range Hops(spans, nil) {
		got = append(got, fmt.Sprintf("%d %s %s %s req=%q served=%q reason=%s inst=%s err=%v", h.Depth, h.Service, h.Kind, h.Name, h.Requested, h.Served, h.Reason, h.Instance, h.Error))
	}
	want := []string{
		`0 gateway server GET / req="alice" served="" reason= inst= err=false`,
		`1 gateway client web req="alice" served="" reason=no_instance_in_lane inst=web-1 err=false`,
		`2 web server GET / req="alice" served="" reason= inst= err=true`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("tree:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	sums := c.Store().Recent(Filter{Lane: "alice"})
	if len(sums) != 1 || sums[0].TraceID != id || sums[0].Service != "gateway" || sums[0].Errors != 1 {
		t.Fatalf("recent alice traces: %+v", sums)
	}
	if got := c.Store().Recent(Filter{Lane: "bob"}); len(got) != 0 {
		t.Fatalf("recent bob traces: %+v", got)
	}
	if got := c.Store().Recent(Filter{Service: "web"}); len(got) != 1 {
		t.Fatalf("recent web traces: %+v", got)
	}
}

// spansOf makes n spans of one trace, for store tests.
func spansOf(trace, n int) []*Span {
	out := make([]*Span, n)
	for i := range out {
		out[i] = &Span{TraceID: fmt.Sprintf("%032x", trace), SpanID: fmt.Sprintf("%016x", trace*1000+i), Name: "GET /orders",
			Service: "orders", Kind: KindServer, HasLane: true, Requested: "alice", InstanceID: "orders-1", InstanceAddr: "127.0.0.1:9000"}
		if i > 0 {
			out[i].ParentID = out[i-1].SpanID
		}
	}
	return out
}

func TestStoreLimits(t *testing.T) {
	t.Run("spans", func(t *testing.T) {
		s := NewStore(Limits{MaxSpans: 10})
		for tr := range 5 {
			s.add(spansOf(tr, 4))
		}
		st := s.Stats()
		if st.Spans > 10 || st.Traces != 2 || st.Dropped.Traces != 3 || st.Dropped.Spans != 12 || st.Dropped.BySpans != 3 {
			t.Fatalf("stats %+v", st)
		}
		if s.Trace(fmt.Sprintf("%032x", 0)) != nil || s.Trace(fmt.Sprintf("%032x", 4)) == nil {
			t.Fatal("the oldest traces must go first")
		}
	})
	t.Run("bytes", func(t *testing.T) {
		one := spansOf(0, 1)[0].size() + traceOverhead // a trace of one span
		s := NewStore(Limits{MaxBytes: 5 * one})
		for tr := range 10 {
			s.add(spansOf(tr, 1))
		}
		st := s.Stats()
		if st.Bytes > 5*one || st.Spans != 5 || st.Dropped.ByBytes != 5 {
			t.Fatalf("stats %+v (one span %d bytes)", st, one)
		}
	})
	t.Run("age", func(t *testing.T) {
		now := time.Unix(1_700_000_000, 0)
		s := NewStore(Limits{MaxAge: time.Minute})
		s.now = func() time.Time { return now }
		s.add(spansOf(1, 2))
		now = now.Add(30 * time.Second)
		s.add(spansOf(2, 2))
		now = now.Add(31 * time.Second)
		if s.Trace(fmt.Sprintf("%032x", 1)) != nil {
			t.Fatal("a trace past its age is still there")
		}
		if s.Trace(fmt.Sprintf("%032x", 2)) == nil {
			t.Fatal("a trace within its age is gone")
		}
		if st := s.Stats(); st.Dropped.ByAge != 1 {
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("duplicate", func(t *testing.T) {
		s := NewStore(Limits{})
		sp := spansOf(1, 3)
		s.add(sp)
		if fresh := s.add(sp); len(fresh) != 0 {
			t.Fatalf("a span stored again: %d", len(fresh))
		}
		if st := s.Stats(); st.Spans != 3 {
			t.Fatalf("stats %+v", st)
		}
	})
}

// TestStoreMemoryBound fills a store bounded at 16 MiB with 100,000 spans and checks that the
// heap it holds stays within that bound.
func TestStoreMemoryBound(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a store with 100,000 spans")
	}
	const bound = 16 << 20
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	for _, perTrace := range []int{1, 5, 50} {
		t.Run(fmt.Sprintf("%d spans a trace", perTrace), func(t *testing.T) {
			before := heap()
			s := NewStore(Limits{MaxBytes: bound, MaxSpans: 1 << 30})
			for tr := range 100_000 / perTrace {
				s.add(spansOf(tr, perTrace)) // what the store does not keep is garbage at once
			}
			after := heap()
			st := s.Stats()
			held := int64(after) - int64(before)
			t.Logf("bound %d bytes; charged %d bytes for %d spans (%d traces), dropped %d spans; heap held %d bytes",
				int64(bound), st.Bytes, st.Spans, st.Traces, st.Dropped.Spans, held)
			if st.Bytes > bound {
				t.Fatalf("charged %d bytes, over the bound %d", st.Bytes, bound)
			}
			if st.Spans+int(st.Dropped.Spans) != 100_000 {
				t.Fatalf("kept %d + dropped %d spans, want 100,000", st.Spans, st.Dropped.Spans)
			}
			if held > bound {
				t.Fatalf("the store holds %d bytes of heap, over its bound of %d", held, int64(bound))
			}
			runtime.KeepAlive(s)
		})
	}
}

func TestValidate(t *testing.T) {
	for _, cfg := range []Config{
		{GRPCAddr: "nohost"},
		{HTTPAddr: "::bad"},
		{Limits: Limits{MaxSpans: -1}},
		{MaxFindings: -2},
	} {
		if err := cfg.Validate(); err == nil {
			t.Errorf("%+v: valid, want an error", cfg)
		}
	}
	if err := (Config{GRPCAddr: "127.0.0.1:4317", HTTPAddr: ":4318"}).Validate(); err != nil {
		t.Error(err)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := &fleet{}
	c, err := New(Config{Registerer: reg, Fleet: f})
	if err != nil {
		t.Fatal(err)
	}
	c.checker.check(c.store.add([]*Span{{TraceID: strings.Repeat("a", 32), SpanID: strings.Repeat("1", 16), Name: "GET /",
		Kind: KindServer, Service: "payments", HasLane: true, Requested: "", InstanceLane: "alice", Admitted: true}}))
	if got := testutil.ToFloat64(c.checker.counter.vec.WithLabelValues("breach", "payments")); got != 1 {
		t.Fatalf("lanes_integrity_findings_total{kind=breach,service=payments} = %v, want 1", got)
	}
	if n, err := testutil.GatherAndCount(reg, "lanes_traces_stored_spans"); err != nil || n != 1 {
		t.Fatalf("lanes_traces_stored_spans: %d series, %v", n, err)
	}
	_ = attribute.Key("")
}

func TestGraph(t *testing.T) {
	c := start(t, Config{})
	web, orders := provider(t, c, "web", false), provider(t, c, "orders", false)
	for i, tc := range []struct{ lane, served, reason string }{
		{"alice", "alice", lanestrace.ReasonNone},
		{"alice", "", lanestrace.ReasonNoInstanceInLane},
		{"", "", lanestrace.ReasonNone},
		{"", "", lanestrace.ReasonNone},
	} {
		ctx, s := hop(context.Background(), web, "GET /", trace.SpanKindServer, lanestrace.Requested.String(tc.lane))
		_, cl := hop(ctx, web, "orders.Get", trace.SpanKindClient, lanestrace.Requested.String(tc.lane), lanestrace.Served.String(tc.served),
			lanestrace.FallbackReason.String(tc.reason), lanestrace.Service.String("orders"), lanestrace.InstanceID.String(fmt.Sprint("o", i)))
		if i == 3 {
			cl.SetStatus(codes.Error, "boom")
		}
		cl.End()
		s.End()
	}
	_ = orders
	g := c.Graph(time.Minute)
	if len(g.Edges) != 2 || strings.Join(g.Services, ",") != "orders,web" {
		t.Fatalf("graph %+v", g)
	}
	base, alice := g.Edges[0], g.Edges[1]
	if base.Lane != "" || base.Calls != 2 || base.Errors != 1 || base.Fallbacks != 0 || base.Served[""] != 2 {
		t.Errorf("baseline edge %+v", base)
	}
	if alice.Lane != "alice" || alice.Calls != 2 || alice.Fallbacks != 1 || alice.Served["alice"] != 1 || alice.Served[""] != 1 {
		t.Errorf("alice edge %+v", alice)
	}
	if alice.Rate != 2.0/60 {
		t.Errorf("rate %v", alice.Rate)
	}
}

// TestReceiveJSON sends spans over OTLP/HTTP in JSON, their ids in hex as the OTLP specification
// and OpenTelemetry's JavaScript exporter write them, and in base64 as protobuf's JSON mapping
// writes them, and reads both back with their ids.
func TestReceiveJSON(t *testing.T) {
	c := start(t, Config{})
	post := func(body string) {
		t.Helper()
		res, err := http.Post("http://"+c.HTTPAddr().String()+"/v1/traces", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		out, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK || strings.Contains(string(out), "rejected") {
			t.Fatalf("OTLP/JSON: %s: %s", res.Status, out)
		}
	}
	const span = `{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"web"}}]},
		"scopeSpans":[{"spans":[{"traceId":%q,"spanId":%q,"parentSpanId":%q,"name":"GET","kind":2,
		"startTimeUnixNano":"1","endTimeUnixNano":"2",
		"attributes":[{"key":"lane.requested","value":{"stringValue":"alice"}}]}]}]}]}`
	post(fmt.Sprintf(span, "5B8EFFF798038103D269B633813FC60C", "eee19b7ec3c1b174", "eee19b7ec3c1b173"))
	hexID, _ := hex.DecodeString("00112233445566778899aabbccddeeff")
	post(fmt.Sprintf(span, base64.StdEncoding.EncodeToString(hexID), base64.StdEncoding.EncodeToString(hexID[:8]), ""))

	for trace, want := range map[string]string{
		"5b8efff798038103d269b633813fc60c": "eee19b7ec3c1b174 parent eee19b7ec3c1b173 alice",
		"00112233445566778899aabbccddeeff": "0011223344556677 parent  alice",
	} {
		spans := c.Store().Trace(trace)
		if len(spans) != 1 {
			t.Fatalf("trace %s: stored %d spans, want 1", trace, len(spans))
		}
		if got := spans[0].SpanID + " parent " + spans[0].ParentID + " " + spans[0].Requested; got != want {
			t.Errorf("trace %s: span %q, want %q", trace, got, want)
		}
	}
}
