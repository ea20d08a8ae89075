package controlplane

import (
	"context"
	"crypto/tls"
	"fmt"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/lanesdev/lanes/internal/app/collector"
	"github.com/lanesdev/lanes/internal/lib/tlsfiles"
	"github.com/lanesdev/lanes/lanestrace"
)

// TracesConfig configures the trace collector of lanes up: its OTLP receivers, the bounds of its
// store, and the gateway's own sampling.
type TracesConfig struct {
	// GRPCAddr and HTTPAddr are the OTLP receivers' addresses; "off" runs none.
	GRPCAddr string `yaml:"otlp_grpc_addr"`
	HTTPAddr string `yaml:"otlp_http_addr"`
	// MaxSpans, MaxMiB and MaxAge bound the store; the oldest traces go first.
	MaxSpans int           `yaml:"max_spans"`
	MaxMiB   int64         `yaml:"max_mib"`
	MaxAge   time.Duration `yaml:"max_age"`
	// Sample is the share of baseline requests that the gateway traces (lane requests are
	// always traced); the decision is made at the gateway and honoured downstream.
	Sample float64 `yaml:"sample"`
}

// TracesOff is the value of an OTLP address that runs no receiver.
const TracesOff = "off"

// Traces is what the collector component provides: the collector, and the tracer provider of
// the control plane's own spans (the gateway's), which exports to the collector.
type Traces struct {
	Collector *collector.Collector
	Provider  trace.TracerProvider
	// GRPCAddr is the OTLP/gRPC address services export to ("" when off): the value of
	// LANES_TRACES.
	GRPCAddr string
	// ClientTLS is what exporters in this process verify the collector with when it serves TLS:
	// its own certificate, pinned (nil without TLS).
	ClientTLS *tls.Config
}

// GatewayService is the service name of the gateway's spans: the entry point of the traces of
// requests it admits.
const GatewayService = "lanes-gateway"

// TracesKey is the collector and the control plane's tracer provider.
var TracesKey = Key[Traces]{"traces"}

func (c *Config) validateTraces() error {
	t := c.Traces
	for _, a := range []struct{ key, v string }{{"traces.otlp_grpc_addr", t.GRPCAddr}, {"traces.otlp_http_addr", t.HTTPAddr}} {
		if a.v == TracesOff {
			continue
		}
		if err := checkListen(a.v); err != nil {
			return c.fail(a.key, a.v, "%v", err)
		}
	}
	if t.MaxSpans <= 0 {
		return c.fail("traces.max_spans", fmt.Sprint(t.MaxSpans), "want a whole number, 1 or more")
	}
	if t.MaxMiB <= 0 {
		return c.fail("traces.max_mib", fmt.Sprint(t.MaxMiB), "want a whole number of MiB, 1 or more")
	}
	if t.MaxAge <= 0 {
		return c.fail("traces.max_age", t.MaxAge.String(), "want a positive duration such as 1h")
	}
	if t.Sample < 0 || t.Sample > 1 {
		return c.fail("traces.sample", fmt.Sprint(t.Sample), "want a number from 0 to 1")
	}
	return nil
}

// collectorComponent runs the trace collector and the control plane's tracer provider.
type collectorComponent struct {
	col   *collector.Collector
	sdk   *sdktrace.TracerProvider
	rt    *Runtime
	fatal fatalWatch
}

func (*collectorComponent) Name() string    { return "traces" }
func (*collectorComponent) Needs() []Dep    { return []Dep{EngineKey} }
func (*collectorComponent) Provides() []Dep { return []Dep{TracesKey} }

func (*collectorComponent) Validate(cfg *Config) error { return cfg.validateTraces() }

func (c *collectorComponent) Provision(ctx context.Context, rt *Runtime) error {
	c.rt = rt
	t := rt.Config.Traces
	addr := func(a string) string {
		if a == TracesOff {
			return ""
		}
		return a
	}
	tc, err := rt.Config.ServerTLS(tlsTraces)
	if err != nil {
		return err
	}
	col, err := collector.New(collector.Config{
		TLS:        tc,
		GRPCAddr:   addr(t.GRPCAddr),
		HTTPAddr:   addr(t.HTTPAddr),
		Limits:     collector.Limits{MaxSpans: t.MaxSpans, MaxBytes: t.MaxMiB << 20, MaxAge: t.MaxAge},
		Fleet:      collector.EngineFleet(Need(rt, EngineKey), func(service string) bool { return service == GatewayService }),
		Registerer: rt.Metrics,
		Logger:     rt.Log,
	})
	if err != nil {
		return err
	}
	if err := col.Start(ctx); err != nil {
		return err
	}
	c.col = col
	out := Traces{Collector: col, Provider: noop.NewTracerProvider()}
	if a := col.GRPCAddr(); a != nil {
		out.GRPCAddr = a.String()
		if tc != nil {
			out.GRPCAddr = listenerURL(a, tc)
			out.ClientTLS = tlsfiles.Pinned(tc)
		}
		note := "trace collector, OTLP/gRPC"
		if h := col.HTTPAddr(); h != nil {
			note += "; OTLP/HTTP on " + h.String()
			if tc != nil {
				note += "; both over TLS"
			}
		}
		rt.Announce(Address{Name: "traces", URL: out.GRPCAddr, Note: note})
		sdk, err := lanestrace.NewProvider(ctx, GatewayService, out.GRPCAddr, t.Sample, out.ClientTLS)
		if err != nil {
			return fmt.Errorf("traces: the control plane's exporter: %w", err)
		}
		c.sdk, out.Provider = sdk, sdk
	}
	Provide(rt, TracesKey, out)
	c.fatal.start(rt, "traces", col.Errors())
	return nil
}

func (c *collectorComponent) Stop(ctx context.Context) error {
	var err error
	if c.sdk != nil {
		err = c.sdk.Shutdown(ctx) // flushes the gateway's last spans into the collector
	}
	c.fatal.stop()
	if c.col != nil {
		if cerr := c.col.Close(ctx); err == nil {
			err = cerr
		}
	}
	return err
}
