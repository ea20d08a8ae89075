package collector

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/lanestrace"
)

// call is the attributes of a client span with a routing decision.
func call(callee, requested, served, reason, instance string) []attribute.KeyValue {
	return []attribute.KeyValue{lanestrace.Service.String(callee), lanestrace.Requested.String(requested),
		lanestrace.Served.String(served), lanestrace.FallbackReason.String(reason), lanestrace.InstanceID.String(instance),
		lanestrace.Eligible.Int(1)}
}

// served is the attributes of a server span.
func served(requested, own string) []attribute.KeyValue {
	return []attribute.KeyValue{lanestrace.Requested.String(requested), lanestrace.InstanceLane.String(own), lanestrace.GuardAdmitted.Bool(true)}
}

type world struct {
	t   *testing.T
	c   *Collector
	tps map[string]trace.TracerProvider
}

func newWorld(t *testing.T, f *fleet) *world {
	c := start(t, Config{Fleet: f})
	w := &world{t: t, c: c, tps: map[string]trace.TracerProvider{}}
	for _, s := range []string{"gateway", "web", "orders", "payments"} {
		w.tps[s] = provider(t, c, s, s == "orders")
	}
	return w
}

func (w *world) findings() []Finding { return w.c.Findings(time.Time{}, "") }

func (w *world) expect(kinds ...string) []Finding {
	w.t.Helper()
	got := w.findings()
	var names []string
	for _, f := range got {
		names = append(names, f.Kind)
	}
	want := append([]string(nil), kinds...)
	if strings.Join(names, ",") != strings.Join(want, ",") {
		w.t.Fatalf("findings %v, want %v:\n%+v", names, want, got)
	}
	return got
}

func defaultFleet() *fleet {
	return &fleet{live: map[string]bool{}, chains: map[string][]string{"alice": {"team-a"}}, entries: map[string]bool{"gateway": true}}
}

// chain sends gateway → web → orders in lane, orders served by ordersLane.
func (w *world) chain(lane, ordersLane, reason string) (traceID string) {
	ctx, entry := hop(context.Background(), w.tps["gateway"], "GET /", trace.SpanKindServer, lanestrace.Entry.Bool(true), lanestrace.Requested.String(lane))
	ctx, c1 := hop(ctx, w.tps["gateway"], "web", trace.SpanKindClient, call("web", lane, "", lanestrace.ReasonNoInstanceInLane, "web-1")...)
	ctx, s1 := hop(ctx, w.tps["web"], "GET /", trace.SpanKindServer, served(lane, "")...)
	ctx, c2 := hop(ctx, w.tps["web"], "orders.Get", trace.SpanKindClient, call("orders", lane, ordersLane, reason, "orders-x")...)
	_, s2 := hop(ctx, w.tps["orders"], "orders.Get", trace.SpanKindServer, served(lane, ordersLane)...)
	s2.End()
	c2.End()
	s1.End()
	c1.End()
	entry.End()
	return entry.SpanContext().TraceID().String()
}

func TestIntegrityClean(t *testing.T) {
	w := newWorld(t, defaultFleet())
	w.chain("alice", "alice", lanestrace.ReasonNone)
	w.chain("alice", "team-a", lanestrace.ReasonNoInstanceInLane)
	w.chain("alice", "", lanestrace.ReasonNoInstanceInLane)
	w.chain("", "", lanestrace.ReasonNone)
	w.expect()
}

func TestIntegrityBreach(t *testing.T) {
	t.Run("baseline served by a lane instance", func(t *testing.T) {
		w := newWorld(t, defaultFleet())
		id := w.chain("", "alice", lanestrace.ReasonNone)
		fs := w.expect(Breach, Breach) // the client's choice and the server that served it
		for _, f := range fs {
			if f.TraceID != id {
				t.Errorf("finding on trace %s, want %s", f.TraceID, id)
			}
		}
		// Newest first: the server span ends, and so arrives, before its client's.
		if fs[0].Service != "web" || !strings.Contains(fs[0].Message, `baseline request to orders was sent to lane "alice"`) {
			t.Errorf("client finding: %+v", fs[0])
		}
		if fs[1].Service != "orders" || !strings.Contains(fs[1].Message, `baseline request was served by an instance of lane "alice"`) {
			t.Errorf("server finding: %+v", fs[1])
		}
	})
	t.Run("a lane its chain does not reach", func(t *testing.T) {
		w := newWorld(t, defaultFleet())
		w.chain("alice", "bob", lanestrace.ReasonNoInstanceInLane)
		fs := w.expect(Breach, Breach)
		if !strings.Contains(fs[0].Message, `lane "alice" to orders was sent to lane "bob", which its chain does not reach`) {
			t.Errorf("%+v", fs[0])
		}
	})
	t.Run("a canary is not a breach", func(t *testing.T) {
		w := newWorld(t, defaultFleet())
		ctx, entry := hop(context.Background(), w.tps["web"], "GET /", trace.SpanKindServer, served("", "")...)
		ctx, c := hop(ctx, w.tps["web"], "orders.Get", trace.SpanKindClient, call("orders", "", "canary-x", lanestrace.ReasonCanary, "orders-c")...)
		_, s := hop(ctx, w.tps["orders"], "orders.Get", trace.SpanKindServer, served("canary-x", "canary-x")...)
		s.End()
		c.End()
		entry.End()
		w.expect()
	})
}

func TestIntegrityNeedlessFallback(t *testing.T) {
	f := defaultFleet()
	f.live["orders/alice"] = true // registered and heartbeating
	w := newWorld(t, f)
	w.chain("alice", "", lanestrace.ReasonNoInstanceInLane) // the caller's view lacks alice's instance
	fs := w.expect(NeedlessFallback)
	if fs[0].Service != "web" || fs[0].Span != "orders.Get" ||
		!strings.Contains(fs[0].Message, `lane "alice" to orders fell back to the baseline (no_instance_in_lane) although orders has a live instance in "alice"`) {
		t.Errorf("%+v", fs[0])
	}
	// A fallback past ejected instances (one refused the connection: killed while its lease
	// runs) is not a needless fallback.
	w.chain("alice", "", lanestrace.ReasonEjected)
	w.expect(NeedlessFallback)
	// A lane whose lifetime ended is not one either.
	w.chain("alice", "", lanestrace.ReasonExpired)
	w.expect(NeedlessFallback)
	// Nor is the retry of a call that alice's live instance failed (it reset or hung).
	w.chain("alice", "", lanestrace.ReasonFailover)
	w.expect(NeedlessFallback)
}

func TestIntegrityLaneLost(t *testing.T) {
	w := newWorld(t, defaultFleet())
	// web receives alice, then calls orders with the lane dropped, through a span of its own.
	ctx, s1 := hop(context.Background(), w.tps["web"], "GET /", trace.SpanKindServer, served("alice", "")...)
	ctx, own := w.tps["web"].Tracer("app").Start(ctx, "render")
	ctx, c2 := hop(ctx, w.tps["web"], "orders.Get", trace.SpanKindClient, call("orders", "", "", lanestrace.ReasonNone, "orders-1")...)
	_, s2 := hop(ctx, w.tps["orders"], "orders.Get", trace.SpanKindServer, served("", "")...)
	s2.End()
	c2.End()
	own.End()
	s1.End() // the parent arrives last: the check runs again when it does
	fs := w.expect(LaneLost)
	if fs[0].Service != "web" || fs[0].SpanID != c2.SpanContext().SpanID().String() ||
		!strings.Contains(fs[0].Message, `orders.Get carries lane "" but its parent GET / (web) carries "alice"`) {
		t.Errorf("%+v", fs[0])
	}
}

func TestIntegrityTraceBroken(t *testing.T) {
	for _, order := range []string{"client first", "server first"} {
		t.Run(order, func(t *testing.T) {
			w := newWorld(t, defaultFleet())
			_, s1 := hop(context.Background(), w.tps["web"], "GET /checkout", trace.SpanKindServer, served("alice", "")...)
			// The handler calls orders with context.Background(): a new trace, no lane.
			_, c2 := hop(context.Background(), w.tps["web"], "orders.Get", trace.SpanKindClient, call("orders", "", "", lanestrace.ReasonNone, "orders-1")...)
			if order == "client first" {
				c2.End()
				s1.End()
			} else {
				s1.End()
				c2.End()
			}
			fs := w.expect(TraceBroken)
			f := fs[0]
			if f.Service != "web" || f.Span != "orders.Get" || f.TraceID != c2.SpanContext().TraceID().String() ||
				f.ParentSpanID != s1.SpanContext().SpanID().String() || f.ParentTraceID != s1.SpanContext().TraceID().String() {
				t.Errorf("%+v", f)
			}
			if !strings.Contains(f.Message, `web started a new trace with orders.Get while serving GET /checkout in lane "alice"`) {
				t.Errorf("%s", f.Message)
			}
			if got := w.c.Findings(time.Time{}, s1.SpanContext().TraceID().String()); len(got) != 1 {
				t.Errorf("findings of the parent's trace: %+v", got)
			}
		})
	}
	t.Run("entry points start traces", func(t *testing.T) {
		w := newWorld(t, defaultFleet())
		_, s1 := hop(context.Background(), w.tps["gateway"], "GET /", trace.SpanKindServer, served("alice", "")...)
		_, c := hop(context.Background(), w.tps["gateway"], "web", trace.SpanKindClient, call("web", "alice", "", lanestrace.ReasonNoInstanceInLane, "web-1")...)
		c.End()
		s1.End()
		w.expect()
	})
}
