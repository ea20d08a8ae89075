package lanesenv_test

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"

	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/lanesenv"
	"github.com/lanesdev/lanes/lanestrace"
)

// appHeader is an application's own propagator: one header of its own.
type appHeader struct{}

func (appHeader) Inject(ctx context.Context, c propagation.TextMapCarrier) { c.Set("x-app", "1") }
func (appHeader) Extract(ctx context.Context, c propagation.TextMapCarrier) context.Context {
	return ctx
}
func (appHeader) Fields() []string { return []string{"x-app"} }

// TestOpenKeepsThePropagator: with tracing on, Open adds the trace context
// and baggage to OpenTelemetry's global propagator and removes nothing the
// application set there, before Open or after it, however many times it is
// called.
func TestOpenKeepsThePropagator(t *testing.T) {
	srv := etcdtest.Embedded(t)
	reg := strings.Replace(srv.Endpoints()[0], "http://", "etcd://", 1)
	traces, err := net.Listen("tcp", "127.0.0.1:0") // a collector that receives nothing: no span is sent
	if err != nil {
		t.Fatal(err)
	}
	defer traces.Close()
	before := otel.GetTextMapPropagator()
	defer func() {
		otel.SetTextMapPropagator(before)
		lanestrace.SetTracerProvider(nil)
	}()
	open := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		e, err := lanesenv.Open(ctx, lanesenv.WithLogger(quiet), lanesenv.WithGetenv(env(
			"LANES_REGISTRY", reg, "LANES_ETCD_PREFIX", "/lanesenv-prop/", "LANES_TRACES", traces.Addr().String())))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
	}
	fields := func() []string {
		f := otel.GetTextMapPropagator().Fields()
		slices.Sort(f)
		return f
	}
	want := func(what string, w ...string) {
		t.Helper()
		slices.Sort(w)
		if got := fields(); !slices.Equal(got, w) {
			t.Errorf("%s: the global propagator carries %q, want %q", what, got, w)
		}
	}

	// Nothing set: lanes' two.
	open()
	want("nothing set", "traceparent", "tracestate", "baggage")
	// Set before Open: kept, first, and lanes adds what is missing.
	otel.SetTextMapPropagator(appHeader{})
	open()
	want("an application's propagator set before", "x-app", "traceparent", "tracestate", "baggage")
	carrier := propagation.MapCarrier{}
	m, _ := baggage.NewMember("tenant", "acme")
	b, _ := baggage.New(m)
	otel.GetTextMapPropagator().Inject(baggage.ContextWithBaggage(context.Background(), b), carrier)
	if carrier["x-app"] != "1" || carrier["baggage"] != "tenant=acme" {
		t.Errorf("injected %v", carrier)
	}
	// TraceContext + Baggage set before: kept as it is, twice.
	app := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	otel.SetTextMapPropagator(app)
	open()
	open()
	want("TraceContext + Baggage set before, Open twice", "traceparent", "tracestate", "baggage") // nothing doubled
	// Set after Open: in force, as the application set it.
	otel.SetTextMapPropagator(appHeader{})
	want("an application's propagator set after", "x-app")
}
