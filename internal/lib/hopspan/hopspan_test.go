package hopspan_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/lib/hopspan"
	"github.com/lanesdev/lanes/lanestrace"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDecisionOf(t *testing.T) {
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	p, err := policy.Parse("policy.yaml", []byte(`
lanes:
  gone: {expires: "`+past+`"}
  locked: {strict: true}
  team-b: {fallback: [team-a]}
  team-c: {fallback: [team-x]}
canary:
  - {service: payments, lane: canary, percent: 100}
outlier: {errors: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	e := routing.New()
	defer e.Close()
	e.SetPolicy(p)
	e.SetInstances("orders", []registry.Instance{
		{Service: "orders", ID: "o1", Addr: "127.0.0.1:1"},
		{Service: "orders", ID: "o2", Addr: "127.0.0.1:2"},
		{Service: "orders", ID: "o-alice", Addr: "127.0.0.1:3", Lane: "alice"},
		{Service: "orders", ID: "o-team-a", Addr: "127.0.0.1:4", Lane: "team-a"},
		{Service: "orders", ID: "o-gone", Addr: "127.0.0.1:5", Lane: "gone"},
	})
	e.SetInstances("payments", []registry.Instance{
		{Service: "payments", ID: "p1", Addr: "127.0.0.1:6"},
		{Service: "payments", ID: "p-canary", Addr: "127.0.0.1:7", Lane: "canary"},
		{Service: "payments", ID: "p-dave", Addr: "127.0.0.1:8", Lane: "dave"},
	})
	decide := func(service, lane string) lanestrace.Decision {
		res, err := e.Pick(service, routing.Request{Lane: lane, Key: "k"})
		return hopspan.DecisionOf(e, e.Service(service), lane, res, err, 0)
	}
	for _, tc := range []struct {
		service, lane, reason, served string
		eligible                      int
	}{
		{"orders", "alice", lanestrace.ReasonNone, "alice", 1},
		{"orders", "", lanestrace.ReasonNone, "", 2},
		// An engine that does not follow the registry's lanes does not call bob unknown
		// (TestUnknownLane); dave has an instance of payments only, team-x is named by the
		// policy only.
		{"orders", "bob", lanestrace.ReasonNoInstanceInLane, "", 2},
		{"orders", "dave", lanestrace.ReasonNoInstanceInLane, "", 2},
		{"orders", "team-x", lanestrace.ReasonNoInstanceInLane, "", 2},
		{"orders", "team-b", lanestrace.ReasonNoInstanceInLane, "team-a", 1},
		{"orders", "gone", lanestrace.ReasonExpired, "", 2},
		{"orders", "locked", lanestrace.ReasonStrict, "", 0},
		{"payments", "", lanestrace.ReasonCanary, "canary", 1},
	} {
		d := decide(tc.service, tc.lane)
		if d.Reason != tc.reason || d.Served != tc.served || d.Eligible != tc.eligible || d.Service != tc.service || d.Requested != tc.lane {
			t.Errorf("%s in lane %q: %+v, want reason %s, served %q, eligible %d", tc.service, tc.lane, d, tc.reason, tc.served, tc.eligible)
		}
	}
	// A retry after alice's only instance failed this call follows the chain: a failover, not an
	// ejection (the instance is not ejected yet) nor an empty lane.
	retry, err := e.Service("orders").PickWithout(routing.Request{Lane: "alice"}, "o-alice")
	if err != nil {
		t.Fatal(err)
	}
	if d := hopspan.DecisionOf(e, e.Service("orders"), "alice", retry, nil, 1); d.Reason != lanestrace.ReasonFailover || d.Served != "" || d.Retries != 1 {
		t.Errorf("alice's retry after o-alice failed: %+v, want a failover to the baseline", d)
	}
	// alice's only instance fails once: ejected, so alice falls back although it is registered.
	res, err := e.Pick("orders", routing.Request{Lane: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	res.Report(false)
	if d := decide("orders", "alice"); d.Reason != lanestrace.ReasonEjected || d.Served != "" {
		t.Errorf("alice ejected: %+v", d)
	}
}

// attrSpan keeps the attributes it is given, in a slice it reuses.
type attrSpan struct {
	noop.Span
	kv []attribute.KeyValue
}

func (s *attrSpan) SetAttributes(kv ...attribute.KeyValue) { s.kv = append(s.kv[:0], kv...) }
func (s *attrSpan) IsRecording() bool                      { return true }

func (s *attrSpan) attrs() map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.kv {
		m[kv.Key] = kv.Value
	}
	return m
}

// A decision and a server side are recorded from attribute sets made once: recording one like
// it again allocates nothing. The attributes at the value a reader takes for an absent one are
// left out, the others are all there.
func TestRecordSets(t *testing.T) {
	span := &attrSpan{kv: make([]attribute.KeyValue, 0, 16)}
	d := lanestrace.Decision{Service: "orders", Requested: "alice", Reason: lanestrace.ReasonNoInstanceInLane, Instance: "o1", Addr: "127.0.0.1:1", Eligible: 2}
	hopspan.RecordDecision(span, d)
	got := span.attrs()
	if len(got) != 6 || got[lanestrace.Service].AsString() != "orders" || got[lanestrace.Requested].AsString() != "alice" ||
		got[lanestrace.InstanceAddr].AsString() != "127.0.0.1:1" || got[lanestrace.Eligible].AsInt64() != 2 {
		t.Errorf("decision attributes %v", got)
	}
	if _, ok := got[lanestrace.Served]; ok {
		t.Error("lane.served written for the baseline")
	}
	if n := testing.AllocsPerRun(100, func() { hopspan.RecordDecision(span, d) }); n != 0 {
		t.Errorf("RecordDecision allocates %v times", n)
	}
	d.Served, d.Retries = "alice", 1
	hopspan.RecordDecision(span, d)
	if got := span.attrs(); got[lanestrace.Served].AsString() != "alice" || got[lanestrace.Retries].AsInt64() != 1 {
		t.Errorf("decision attributes %v", got)
	}

	hopspan.RecordServer(span, "alice", "", true, false)
	got = span.attrs()
	if len(got) != 2 || got[lanestrace.Requested].AsString() != "alice" || !got[lanestrace.GuardAdmitted].AsBool() {
		t.Errorf("server attributes %v", got)
	}
	if n := testing.AllocsPerRun(100, func() { hopspan.RecordServer(span, "alice", "", true, false) }); n != 0 {
		t.Errorf("RecordServer allocates %v times", n)
	}
	hopspan.RecordServer(span, "", "bob", false, true)
	if got := span.attrs(); got[lanestrace.InstanceLane].AsString() != "bob" || got[lanestrace.GuardAdmitted].AsBool() || !got[lanestrace.GuardExempt].AsBool() {
		t.Errorf("server attributes %v", got)
	}
}

// TestUnknownLane: with an engine that follows the lanes of the whole registry, a lane request
// in a lane that exists nowhere falls back with unknown_lane; one in a lane with instances of
// another service only, with no_instance_in_lane.
func TestUnknownLane(t *testing.T) {
	reg := registry.NewMemory()
	defer reg.Close()
	ctx := context.Background()
	for _, in := range []registry.Instance{
		{Service: "orders", ID: "o1", Addr: "127.0.0.1:1"},
		{Service: "payments", ID: "p-dave", Addr: "127.0.0.1:2", Lane: "dave"},
	} {
		l, err := reg.Register(ctx, in, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
	}
	e := routing.New(routing.WithRegistry(reg), routing.WithRegistryLanes())
	defer e.Close()
	if err := e.Service("orders").WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !e.KnownLane("dave") || !e.UnknownLane("bob") {
		if time.Now().After(deadline) {
			t.Fatal("the registry's lanes were not listed within 30s")
		}
		time.Sleep(time.Millisecond)
	}
	for lane, want := range map[string]string{"bob": lanestrace.ReasonUnknownLane, "dave": lanestrace.ReasonNoInstanceInLane} {
		res, err := e.Pick("orders", routing.Request{Lane: lane})
		if err != nil {
			t.Fatal(err)
		}
		if d := hopspan.DecisionOf(e, e.Service("orders"), lane, res, nil, 0); d.Reason != want || d.Served != "" {
			t.Errorf("orders in lane %s: %+v, want reason %s", lane, d, want)
		}
	}
}

// TestDecisionOfTunnel: a hop to an instance of lanes dev's tunnel says
// where it really runs; any other hop does not.
func TestDecisionOfTunnel(t *testing.T) {
	e := routing.New()
	defer e.Close()
	e.SetInstances("web", []registry.Instance{
		{Service: "web", ID: "w1", Addr: "127.0.0.1:1"},
		{Service: "web", ID: "laptop", Addr: "127.0.0.1:2", Lane: "alice",
			Labels: map[string]string{registry.LabelPath: registry.PathTunnel, registry.LabelTunnelFrom: "203.0.113.7"}},
	})
	for _, tc := range []struct{ lane, tunnel string }{{"alice", "203.0.113.7"}, {"", ""}} {
		res, err := e.Pick("web", routing.Request{Lane: tc.lane})
		d := hopspan.DecisionOf(e, e.Service("web"), tc.lane, res, err, 0)
		if d.Tunnel != tc.tunnel {
			t.Errorf("lane %q: Tunnel %q, want %q", tc.lane, d.Tunnel, tc.tunnel)
		}
		has := false
		for _, kv := range d.Attributes() {
			if kv.Key == lanestrace.InstanceTunnel {
				has = kv.Value.AsString() == tc.tunnel
			}
		}
		if has != (tc.tunnel != "") {
			t.Errorf("lane %q: attributes %v", tc.lane, d.Attributes())
		}
	}
}

// RecordDecisionMidSpan records what RecordDecision records, in two parts: the same attributes
// and, when no instance was chosen, the same failure.
func TestRecordDecisionMidSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	base := lanestrace.Decision{Service: "orders", Reason: lanestrace.ReasonNone, Instance: "o1", Addr: "127.0.0.1:1", Eligible: 2}
	lane, retry, none := base, base, base
	lane.Requested, lane.Served = "alice", "alice"
	retry.Retries = 1
	none.Instance, none.Addr, none.Reason = "", "", lanestrace.ReasonNoInstanceInLane
	for _, d := range []lanestrace.Decision{base, lane, retry, none} {
		for _, record := range []func(trace.Span, lanestrace.Decision){hopspan.RecordDecision, hopspan.RecordDecisionMidSpan} {
			_, span := tp.Tracer("hopspan").Start(context.Background(), "call", trace.WithAttributes(attribute.String("rpc.method", "m")))
			record(span, d)
			span.SetAttributes(attribute.String("server.address", "127.0.0.1"), attribute.Int("server.port", 1))
			span.End()
		}
		ended := rec.Ended()
		whole, split := ended[len(ended)-2], ended[len(ended)-1]
		if !slices.Equal(whole.Attributes(), split.Attributes()) || whole.Status() != split.Status() {
			t.Errorf("%+v: recorded in two parts %v %v, at once %v %v", d, split.Attributes(), split.Status(), whole.Attributes(), whole.Status())
		}
	}
}

// On a span that starts with otelgrpc's two attributes and gets three after the pick, a decision
// of four, five or six attributes (a baseline call, a lane call served by its lane, a fallback)
// costs no allocation more than the span's own attributes do: the second part of the decision
// grows the slice to room for what comes after.
func TestRecordDecisionMidSpanGrowth(t *testing.T) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer tp.Shutdown(context.Background())
	tr := tp.Tracer("t")
	start := trace.WithAttributes(attribute.String("rpc.method", "s/m"), attribute.String("rpc.system.name", "grpc"))
	after := []attribute.KeyValue{attribute.String("server.address", "127.0.0.1"), attribute.Int("server.port", 1)}
	status := attribute.Int("rpc.response.status_code", 0)
	span := func(decide func(trace.Span)) float64 {
		return testing.AllocsPerRun(100, func() {
			_, s := tr.Start(context.Background(), "c", start)
			decide(s)
			s.SetAttributes(after...)
			s.SetAttributes(status)
			s.End()
		})
	}
	plain := span(func(trace.Span) {})
	for _, d := range []lanestrace.Decision{
		{Service: "orders", Reason: lanestrace.ReasonNone, Instance: "o1", Addr: "127.0.0.1:1", Eligible: 2},
		{Service: "orders", Requested: "alice", Served: "alice", Reason: lanestrace.ReasonNone, Instance: "o2", Addr: "127.0.0.1:2", Eligible: 1},
		{Service: "orders", Requested: "bob", Reason: lanestrace.ReasonNoInstanceInLane, Instance: "o1", Addr: "127.0.0.1:1", Eligible: 2},
	} {
		hopspan.RecordDecisionMidSpan(noop.Span{}, d) // its set, made once
		if n := span(func(s trace.Span) { hopspan.RecordDecisionMidSpan(s, d) }); n != plain {
			t.Errorf("a decision of %d attributes: %v allocations a span, %v without it", len(d.Attributes()), n, plain)
		}
	}
}
