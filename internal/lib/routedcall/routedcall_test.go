package routedcall_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/lib/routedcall"
	"github.com/lanesdev/lanes/internal/testkit/leaktest"
	"github.com/lanesdev/lanes/lanesmetrics"
	"github.com/lanesdev/lanes/lanestrace"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

func TestClassify(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		a    routedcall.Attempt
		want routedcall.Outcome
	}{
		{"200", routedcall.Attempt{Status: 200}, routedcall.Success},
		{"421 from the guard", routedcall.Attempt{Status: 421, Downstream: true, Misdirected: true}, routedcall.Success},
		{"500", routedcall.Attempt{Status: 500}, routedcall.Failure},
		{"503 routing failure downstream", routedcall.Attempt{Status: 503, Downstream: true}, routedcall.Success},
		{"reset", routedcall.Attempt{Err: boom}, routedcall.Failure},
		{"refused", routedcall.Attempt{Err: boom, Unsent: true}, routedcall.Unreachable},
		{"caller gone", routedcall.Attempt{Err: boom, CallerGone: true}, routedcall.Ignore},
		{"caller gone while dialling", routedcall.Attempt{Err: boom, Unsent: true, CallerGone: true}, routedcall.Ignore},
	} {
		if got := routedcall.Classify(tc.a); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	for code, want := range map[uint32]routedcall.Outcome{0: routedcall.Success, 1: routedcall.Ignore, 2: routedcall.Success, 4: routedcall.Ignore, 13: routedcall.Success, 14: routedcall.Failure} {
		if got := routedcall.ClassifyGRPC(code); got != want {
			t.Errorf("gRPC code %d: %v, want %v", code, got, want)
		}
	}
}

func engine(t *testing.T, doc string, insts ...registry.Instance) *routing.Engine {
	t.Helper()
	e := routing.New()
	t.Cleanup(func() { e.Close() })
	p, err := policy.Parse("test", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	e.SetPolicy(p)
	e.SetInstances("orders", insts)
	return e
}

// TestUnreachableMovesOn: an Unreachable ejects the instance at once and the
// call moves on, without spending the retry budget, along the fallback
// chain.
func TestUnreachableMovesOn(t *testing.T) {
	e := engine(t, "outlier: {errors: 5}\n",
		registry.Instance{ID: "a1", Service: "orders", Addr: "a1:1", Lane: "alice"},
		registry.Instance{ID: "b1", Service: "orders", Addr: "b1:1"})
	var c routedcall.Call
	p, err := c.Start(context.Background(), e.Service("orders"), routing.Request{Lane: "alice"}, 0, time.Second)
	if err != nil || p.Instance.ID != "a1" {
		t.Fatalf("first pick %v %v", p.Instance, err)
	}
	if !c.Again(routedcall.Unreachable, false, true) {
		t.Fatal("no move past an unreachable instance")
	}
	p, ok := c.Next()
	if !ok || p.Instance.ID != "b1" || p.Reason != routing.ReasonLaneEmpty {
		t.Fatalf("next pick %v %v %v, want b1 by the fallback to the baseline", p.Instance, p.Reason, ok)
	}
	// No retry budget: a failure ends the call.
	if c.Again(routedcall.Failure, true, true) {
		t.Fatal("a failure was retried with no budget")
	}
	if !c.Retried() {
		t.Fatal("Retried: false after a move")
	}
}

// TestLateAbandonCounts: an Ignore for an attempt that the caller abandoned
// after the response-header timeout is a failure; before it, nothing.
func TestLateAbandonCounts(t *testing.T) {
	e := engine(t, "outlier: {errors: 1}\n", registry.Instance{ID: "b1", Service: "orders", Addr: "b1:1"},
		registry.Instance{ID: "b2", Service: "orders", Addr: "b2:1"})
	svc := e.Service("orders")
	abandoned := func(timeout time.Duration) string {
		ctx, cancel := context.WithCancel(context.Background())
		var c routedcall.Call
		p, err := c.Start(ctx, svc, routing.Request{}, 1, timeout)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond) // the attempt takes longer than a 1ns timeout
		cancel()
		if c.Again(routedcall.Ignore, true, true) {
			t.Fatal("retried after the caller gave up")
		}
		return p.Instance.ID
	}
	abandoned(time.Hour)
	if d, _ := svc.Resolve(routing.Request{}); len(d.Eligible) != 2 {
		t.Fatalf("eligible %v after an early abandon, want both", d.Eligible)
	}
	id := abandoned(time.Nanosecond)
	if d, _ := svc.Resolve(routing.Request{}); len(d.Eligible) != 1 || d.Eligible[0] == id {
		t.Fatalf("eligible %v after a late abandon of %s, want it ejected", d.Eligible, id)
	}
}

// TestTimeout: a timeout setting of 0 is the default, a negative one none.
func TestTimeout(t *testing.T) {
	for _, tc := range []struct{ d, want time.Duration }{
		{0, 7 * time.Second},
		{-1, 0},
		{-time.Hour, 0},
		{time.Millisecond, time.Millisecond},
	} {
		if got := routedcall.Timeout(tc.d, 7*time.Second); got != tc.want {
			t.Errorf("Timeout(%v, 7s) = %v, want %v", tc.d, got, tc.want)
		}
	}
	if got := routedcall.HeaderTimeout(0); got != routedcall.DefaultResponseHeaderTimeout {
		t.Errorf("HeaderTimeout(0) = %v, want %v", got, routedcall.DefaultResponseHeaderTimeout)
	}
}

// TestFailureFollowsTheChain: once every instance of the lane failed the
// call, its retry follows the lane chain (for this call only); a strict lane
// gets no retry.
func TestFailureFollowsTheChain(t *testing.T) {
	e := engine(t, "outlier: {errors: 5}\nlanes:\n  alice: {fallback: [team-a]}\n  solo: {strict: true}\n",
		registry.Instance{ID: "a1", Service: "orders", Addr: "a1:1", Lane: "alice"},
		registry.Instance{ID: "a2", Service: "orders", Addr: "a2:1", Lane: "alice"},
		registry.Instance{ID: "t1", Service: "orders", Addr: "t1:1", Lane: "team-a"},
		registry.Instance{ID: "s1", Service: "orders", Addr: "s1:1", Lane: "solo"},
		registry.Instance{ID: "b1", Service: "orders", Addr: "b1:1"})
	svc := e.Service("orders")
	var c routedcall.Call
	p, err := c.Start(context.Background(), svc, routing.Request{Lane: "alice"}, 3, time.Second)
	if err != nil || p.Lane != "alice" {
		t.Fatalf("first pick %v %v", p.Instance, err)
	}
	var got []string
	for c.Again(routedcall.Failure, true, true) {
		p, ok := c.Next()
		if !ok {
			t.Fatalf("no retry after %v", got)
		}
		got = append(got, p.Instance.ID+"/"+p.Reason.String())
	}
	other := map[string]string{"a1": "a2", "a2": "a1"}[p.Instance.ID]
	if want := []string{other + "/lane", "t1/failover", "b1/failover"}; !slices.Equal(got, want) {
		t.Fatalf("retries %v, want %v", got, want)
	}
	// The lane is not ejected: the next call starts in it again.
	if p, err := svc.Pick(routing.Request{Lane: "alice"}); err != nil || p.Lane != "alice" {
		t.Fatalf("next call's pick %v in %q, %v; want alice", p.Instance, p.Lane, err)
	}

	if _, err := c.Start(context.Background(), svc, routing.Request{Lane: "solo"}, 3, time.Second); err != nil {
		t.Fatal(err)
	}
	if !c.Again(routedcall.Failure, true, true) {
		t.Fatal("no retry allowed")
	}
	if p, ok := c.Next(); ok {
		t.Fatalf("strict lane retried on %s in %q", p.Instance.ID, p.Lane)
	}
}

// fakeSender answers each attempt from a script, by instance id: what a
// wire would say. It records what Run asked of it.
type fakeSender struct {
	answer  map[string]routedcall.Attempt // by instance id; missing: 200
	replay  bool                          // the body can be sent again
	sent    []string                      // instance ids, in order
	traced  []bool                        // whether each attempt's context had a span
	replays []routedcall.Outcome          // the outcomes Replayable was asked about
	dropped int
}

func (s *fakeSender) Send(ctx context.Context, pick routing.Result) routedcall.Attempt {
	s.sent = append(s.sent, pick.Instance.ID)
	s.traced = append(s.traced, trace.SpanContextFromContext(ctx).IsValid())
	if a, ok := s.answer[pick.Instance.ID]; ok {
		return a
	}
	return routedcall.Attempt{Status: 200}
}

func (s *fakeSender) Replayable(o routedcall.Outcome) bool {
	s.replays = append(s.replays, o)
	return s.replay
}

func (s *fakeSender) Drop() { s.dropped++ }

var (
	refused = routedcall.Attempt{Err: errors.New("connection refused"), Unsent: true}
	reset   = routedcall.Attempt{Err: errors.New("connection reset")}
)

func spec(svc *routing.Service, l string, idem bool) routedcall.Spec {
	return routedcall.Spec{Service: svc, Request: routing.Request{Lane: l}, Method: "GET", Idempotent: idem}
}

// TestRun runs calls with a scripted sender over a real engine: the retry
// of an idempotent failure on another instance, the moves past unreachable
// instances whatever the method, and the calls that end at once.
func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name    string
		retries int
		idem    bool
		replay  bool
		answer  map[string]routedcall.Attempt
		sent    []string // in order; "*" is either baseline instance
		dropped int
		replays int
	}{
		{name: "served", idem: true, replay: true, sent: []string{"a1"}},
		{name: "failure retried once", idem: true, replay: true,
			answer: map[string]routedcall.Attempt{"a1": reset, "b1": reset, "b2": reset},
			sent:   []string{"a1", "*"}, dropped: 1, replays: 1},
		{name: "failure not retried: not idempotent", idem: false, replay: true,
			answer: map[string]routedcall.Attempt{"a1": reset}, sent: []string{"a1"}},
		{name: "failure not retried: retries off", retries: -1, idem: true, replay: true,
			answer: map[string]routedcall.Attempt{"a1": reset}, sent: []string{"a1"}},
		{name: "failure not retried: body spent", idem: true, replay: false,
			answer: map[string]routedcall.Attempt{"a1": reset}, sent: []string{"a1"}, replays: 1},
		{name: "unreachable moves on, not idempotent", idem: false, replay: true,
			answer: map[string]routedcall.Attempt{"a1": refused}, sent: []string{"a1", "*"}, dropped: 1, replays: 1},
		{name: "unreachable moves on past every instance", retries: -1, replay: true,
			answer: map[string]routedcall.Attempt{"a1": refused, "b1": refused, "b2": refused},
			sent:   []string{"a1", "*", "*"}, dropped: 2, replays: 3},
		{name: "5xx is a failure, not retried", retries: 2, idem: true, replay: true,
			answer: map[string]routedcall.Attempt{"a1": {Status: 502}}, sent: []string{"a1"}},
		{name: "503 retried by status", idem: true, replay: true,
			answer: map[string]routedcall.Attempt{"a1": {Status: 503, Downstream: true, RetryStatus: true}},
			sent:   []string{"a1", "*"}, dropped: 1, replays: 1},
		{name: "misdirected retried whatever the method", replay: true,
			answer: map[string]routedcall.Attempt{"a1": {Status: 421, Downstream: true, Misdirected: true}},
			sent:   []string{"a1", "*"}, dropped: 1, replays: 1},
		{name: "final answer returned as it is", idem: true, replay: true,
			answer: map[string]routedcall.Attempt{"a1": {Status: 500, Final: true}}, sent: []string{"a1"}},
		{name: "classified by the client", idem: true, replay: true,
			answer: map[string]routedcall.Attempt{"a1": {Status: 500, Classified: true, Outcome: routedcall.Success}}, sent: []string{"a1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := engine(t, "outlier: {errors: 5}\n",
				registry.Instance{ID: "a1", Service: "orders", Addr: "a1:1", Lane: "alice"},
				registry.Instance{ID: "b1", Service: "orders", Addr: "b1:1"},
				registry.Instance{ID: "b2", Service: "orders", Addr: "b2:1"})
			s := &fakeSender{answer: tc.answer, replay: tc.replay}
			var c routedcall.Call
			cfg := routedcall.Config{Engine: e, Retries: tc.retries}
			if err := c.Run(context.Background(), &cfg, spec(e.Service("orders"), "alice", tc.idem), s); err != nil {
				t.Fatal(err)
			}
			if len(s.sent) != len(tc.sent) {
				t.Fatalf("sent to %v, want %v", s.sent, tc.sent)
			}
			for i, id := range tc.sent {
				if id != "*" && s.sent[i] != id || id == "*" && s.sent[i][0] != 'b' {
					t.Fatalf("sent to %v, want %v", s.sent, tc.sent)
				}
			}
			if len(s.sent) == 3 && s.sent[1] == s.sent[2] {
				t.Fatalf("sent twice to %s, which failed the call", s.sent[1])
			}
			if s.dropped != tc.dropped || len(s.replays) != tc.replays {
				t.Fatalf("dropped %d answers, asked Replayable %d times; want %d and %d", s.dropped, len(s.replays), tc.dropped, tc.replays)
			}
			if got := c.Retries(); got != len(s.sent)-1 {
				t.Fatalf("Retries %d after %d attempts", got, len(s.sent))
			}
			if c.Pick().Instance.ID != s.sent[len(s.sent)-1] {
				t.Fatalf("Pick %s, last attempt on %s", c.Pick().Instance.ID, s.sent[len(s.sent)-1])
			}
		})
	}
}

// TestRunReports: Run reports each attempt to outlier detection: an
// unreachable instance is ejected at once, a failure counts, a final answer
// is left for the sender to report.
func TestRunReports(t *testing.T) {
	e := engine(t, "outlier: {errors: 1}\n",
		registry.Instance{ID: "b1", Service: "orders", Addr: "b1:1"},
		registry.Instance{ID: "b2", Service: "orders", Addr: "b2:1"})
	svc := e.Service("orders")
	eligible := func() int {
		d, _ := svc.Resolve(routing.Request{})
		return len(d.Eligible)
	}
	run := func(a routedcall.Attempt) *routedcall.Call {
		s := &fakeSender{answer: map[string]routedcall.Attempt{"b1": a, "b2": a}}
		c := new(routedcall.Call)
		if err := c.Run(context.Background(), &routedcall.Config{}, spec(svc, "", false), s); err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := run(routedcall.Attempt{Status: 502, Final: true})
	if eligible() != 2 {
		t.Fatal("a final answer was reported by Run")
	}
	c.Report(routedcall.Failure) // as the sender does once it knows
	if eligible() != 1 {
		t.Fatal("the sender's report of a final answer was lost")
	}
	c.Report(routedcall.Failure) // once per pick
	if eligible() != 1 {
		t.Fatal("a second report of one attempt counted")
	}
}

// TestRunNoInstance: a call that no instance may serve returns the routing
// error, sends nothing, and records the decision as failed.
func TestRunNoInstance(t *testing.T) {
	e := engine(t, "lanes:\n  solo: {strict: true}\n", registry.Instance{ID: "b1", Service: "orders", Addr: "b1:1"})
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	s := &fakeSender{}
	var c routedcall.Call
	err := c.Run(context.Background(), &routedcall.Config{Engine: e, Tracer: tp.Tracer("test")}, spec(e.Service("orders"), "solo", true), s)
	var re *routing.Error
	if !errors.As(err, &re) || re.Code != routing.CodeLaneUnavailable {
		t.Fatalf("error %v, want lane_unavailable", err)
	}
	if len(s.sent) != 0 || c.Started() {
		t.Fatalf("sent %v", s.sent)
	}
	spans := rec.Ended()
	if len(spans) != 1 || spans[0].Status().Code != codes.Error {
		t.Fatalf("spans %v", spans)
	}
	if got := attrOf(spans[0], lanestrace.FallbackReason); got != lanestrace.ReasonStrict {
		t.Fatalf("reason %q, want %q", got, lanestrace.ReasonStrict)
	}
}

func attrOf(s sdktrace.ReadOnlySpan, k attribute.Key) string {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value.String()
		}
	}
	return ""
}

// TestRunTraced: a traced call writes one client span, parent of every
// attempt's context, with the decision of the last pick and the last
// attempt's status; the metrics count the decision.
func TestRunTraced(t *testing.T) {
	e := engine(t, "outlier: {errors: 5}\n",
		registry.Instance{ID: "a1", Service: "orders", Addr: "a1:1", Lane: "alice"},
		registry.Instance{ID: "b1", Service: "orders", Addr: "b1:1"})
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	reg := prometheus.NewRegistry()
	m, err := lanesmetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	s := &fakeSender{answer: map[string]routedcall.Attempt{"a1": refused, "b1": {Status: 404}}, replay: true}
	var c routedcall.Call
	cfg := routedcall.Config{Engine: e, Tracer: tp.Tracer("test"), Metrics: m}
	if err := c.Run(context.Background(), &cfg, spec(e.Service("orders"), "alice", false), s); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.traced, []bool{true, true}) {
		t.Fatalf("attempts traced %v", s.traced)
	}
	spans := rec.Ended()
	if len(spans) != 1 || spans[0].SpanKind() != trace.SpanKindClient || spans[0].Name() != "GET" {
		t.Fatalf("spans %v", spans)
	}
	for k, want := range map[attribute.Key]string{
		lanestrace.InstanceID: "b1", lanestrace.Requested: "alice", lanestrace.Served: "",
		lanestrace.Retries: "1", lanestrace.FallbackReason: lanestrace.ReasonEjected,
		"http.response.status_code": "404", "server.address": "orders",
	} {
		if got := attrOf(spans[0], k); got != want {
			t.Errorf("span %s = %q, want %q", k, got, want)
		}
	}
	want := `
# HELP lanes_requests_total Routed requests by service called, lane requested, lane served and reason (lanestrace's fallback reasons). Lanes past the first 32 and services past the first 128 are counted as "other".
# TYPE lanes_requests_total counter
lanes_requests_total{lane_requested="alice",lane_served="baseline",reason="ejected",service="orders"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "lanes_requests_total"); err != nil {
		t.Fatal(err)
	}
}

// reuseSender answers 200 without allocating.
type reuseSender struct{}

func (reuseSender) Send(context.Context, routing.Result) routedcall.Attempt {
	return routedcall.Attempt{Status: 200}
}
func (reuseSender) Replayable(routedcall.Outcome) bool { return true }
func (reuseSender) Drop()                              {}

// TestRunAllocs: an untraced, uncounted call allocates nothing of its own.
func TestRunAllocs(t *testing.T) {
	e := engine(t, "", registry.Instance{ID: "a1", Service: "orders", Addr: "a1:1", Lane: "alice"},
		registry.Instance{ID: "b1", Service: "orders", Addr: "b1:1"})
	var c routedcall.Call
	cfg := routedcall.Config{Engine: e}
	var s routedcall.Sender = reuseSender{}
	ctx := context.Background()
	for _, l := range []string{"", "alice", "bob"} {
		sp := spec(e.Service("orders"), l, true)
		if n := testing.AllocsPerRun(1000, func() {
			if err := c.Run(ctx, &cfg, sp, s); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("lane %q: Run allocates %.1f times per call", l, n)
		}
	}
}
