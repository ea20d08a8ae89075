package collector

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fleet is a Fleet whose answers a test sets.
type fleet struct {
	live    map[string]bool // service/lane
	chains  map[string][]string
	entries map[string]bool
}

func (f *fleet) LiveInLane(service, lane string) bool { return f.live[service+"/"+lane] }
func (f *fleet) Entry(service string) bool            { return f.entries[service] }
func (f *fleet) Reaches(lane, served string) bool {
	if served == lane || served == "" {
		return true
	}
	for _, l := range f.chains[lane] {
		if l == served {
			return true
		}
	}
	return false
}

// start starts a collector on free loopback ports and closes it when the test ends.
func start(t *testing.T, cfg Config) *Collector {
	t.Helper()
	if cfg.GRPCAddr == "" {
		cfg.GRPCAddr = "127.0.0.1:0"
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Auth == "" && cfg.Authenticate == nil {
		cfg.Auth = AuthLoopback // the tests' senders are on loopback
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	return c
}

// provider is an OpenTelemetry SDK tracer provider for one service, exporting to c over gRPC or
// HTTP with a synchronous span processor, so that a span has reached the collector when End
// returns.
func provider(t *testing.T, c *Collector, service string, overHTTP bool) *sdktrace.TracerProvider {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var exp sdktrace.SpanExporter
	var err error
	if overHTTP {
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(c.HTTPAddr().String()), otlptracehttp.WithInsecure())
	} else {
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(c.GRPCAddr().String()), otlptracegrpc.WithInsecure())
	}
	if err != nil {
		t.Fatal(err)
	}
	res := resource.NewSchemaless(semconv.ServiceName(service))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(res))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return tp
}

// hop starts a span of kind k with attributes, as lanes' transports would.
func hop(ctx context.Context, tp trace.TracerProvider, name string, k trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return tp.Tracer("lanes-test").Start(ctx, name, trace.WithSpanKind(k), trace.WithAttributes(attrs...))
}
