package lanestrace

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/lanesdev/lanes/internal/lib/tlsfiles"
	"github.com/lanesdev/lanes/internal/lib/traceexport"
)

// Environment variables read by FromEnv.
const (
	// EnvTraces is the OTLP/gRPC address of the trace collector of `lanes up` (host:port, or an
	// http:// or https:// URL); "off" turns tracing off. `lanes up` prints the line to export.
	EnvTraces = "LANES_TRACES"
	// EnvSample is the share of baseline requests sampled at the entry, 0 to 1 (default 1).
	// Lane requests are always sampled.
	EnvSample = "LANES_TRACE_SAMPLE"
	// EnvTracesToken is the token sent with the spans to the collector of LANES_TRACES: the
	// telemetry token that `lanes up` prints. Unset, the service's registration token
	// (EnvToken) is sent.
	EnvTracesToken = "LANES_TRACES_TOKEN"
	// EnvToken is the service's registration token, as package lanesenv reads it.
	EnvToken = "LANES_TOKEN"
	// EnvCAFile is the PEM file of the CA that an https:// LANES_TRACES is verified with (the
	// system's roots when unset); lanes up prints it when its collector serves TLS.
	EnvCAFile = tlsfiles.EnvCAFile
)

// Tracing is the OpenTelemetry set-up of a service: a tracer provider exporting to the
// collector of `lanes up` (and to the endpoint of the OTEL_EXPORTER_OTLP_* variables, where
// set), with lanes' Sampler.
type Tracing struct {
	// Provider is the tracer provider; FromEnv also makes it the global one. It is a no-op
	// provider when tracing is off.
	Provider trace.TracerProvider
	sdk      *sdktrace.TracerProvider
}

// Shutdown flushes the spans not yet exported and stops the exporters.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.sdk == nil {
		return nil
	}
	return t.sdk.Shutdown(ctx)
}

// FromEnv sets up tracing for service from the environment (getenv; nil is os.Getenv):
// LANES_TRACES for lanes' collector, with LANES_TRACES_TOKEN, else LANES_TOKEN, as its credential
// (sent to that collector only, as "Authorization: Bearer <token>"), OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (with the other OTEL_EXPORTER_OTLP_* variables, as
// OpenTelemetry defines them) for an external one, both where both are set, and
// LANES_TRACE_SAMPLE; an https:// LANES_TRACES is verified with LANES_CA_FILE where set.
// OTEL_SERVICE_NAME, where set, names the service instead of service; else, once the process
// registers an instance with the Serve helpers of laneshttp or lanesgrpc, the spans it exports
// carry that instance's service (service.name) and lane (lane.instance.lane). With none of the
// endpoints set, or LANES_TRACES=off, tracing is off and Provider is a no-op.
//
// It installs the provider as OpenTelemetry's global, and as the provider of the transports of
// lanes created afterwards (SetTracerProvider). It adds to OpenTelemetry's global propagator what
// lanes needs, the W3C trace context and baggage, and keeps what the application set there: a
// propagator set before keeps its place, first; one set afterwards replaces lanes' (the lanes
// transports propagate the trace context and the lane themselves, whatever the global one).
func FromEnv(ctx context.Context, service string, getenv func(string) string) (*Tracing, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	ratio := 1.0
	if v := strings.TrimSpace(getenv(EnvSample)); v != "" {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || r < 0 || r > 1 {
			return nil, fmt.Errorf("lanestrace: %s=%q: want a number from 0 to 1", EnvSample, v)
		}
		ratio = r
	}
	named := getenv("OTEL_SERVICE_NAME") != "" // else the transports' Serve name the spans
	if named {
		service = getenv("OTEL_SERVICE_NAME")
	}
	identified := func(exp sdktrace.SpanExporter) sdktrace.SpanExporter {
		if named {
			return exp
		}
		return traceexport.Identified(exp)
	}
	lanes := strings.TrimSpace(getenv(EnvTraces))
	external := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
	if lanes == "off" || (lanes == "" && !external) {
		return &Tracing{Provider: noop.NewTracerProvider()}, nil
	}
	var opts []sdktrace.TracerProviderOption
	if lanes != "" {
		token := strings.TrimSpace(getenv(EnvTracesToken))
		if token == "" {
			token = strings.TrimSpace(getenv(EnvToken))
		}
		var tc *tls.Config
		if ca := strings.TrimSpace(getenv(EnvCAFile)); ca != "" && strings.HasPrefix(lanes, "https://") {
			c, err := tlsfiles.Client(ca)
			if err != nil {
				return nil, fmt.Errorf("lanestrace: %s: %w", EnvCAFile, err)
			}
			tc = c
		}
		exp, err := traceexport.Exporter(ctx, lanes, token, tc)
		if err != nil {
			return nil, fmt.Errorf("lanestrace: %s=%q: %w", EnvTraces, lanes, err)
		}
		opts = append(opts, sdktrace.WithBatcher(identified(exp), sdktrace.WithBatchTimeout(traceexport.BatchTimeout)))
	}
	if external {
		// The exporter reads the OTEL_EXPORTER_OTLP_* variables itself.
		exp, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("lanestrace: the OTEL_EXPORTER_OTLP_* endpoint: %w", err)
		}
		opts = append(opts, sdktrace.WithBatcher(identified(exp)))
	}
	res, err := traceexport.Resource(service)
	if err != nil {
		return nil, fmt.Errorf("lanestrace: %w", err)
	}
	opts = append(opts, sdktrace.WithResource(res), sdktrace.WithSampler(Sampler(ratio)))
	tp := sdktrace.NewTracerProvider(opts...)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(withLanes(otel.GetTextMapPropagator()))
	SetTracerProvider(tp)
	return &Tracing{Provider: tp, sdk: tp}, nil
}

// withLanes returns cur with the W3C trace context and baggage propagators added after it, where
// cur does not already carry their headers; cur itself when it does. An unset global propagator
// (it carries no header) is replaced.
func withLanes(cur propagation.TextMapPropagator) propagation.TextMapPropagator {
	has := map[string]bool{}
	for _, f := range cur.Fields() {
		has[strings.ToLower(f)] = true
	}
	var add []propagation.TextMapPropagator
	if !has["traceparent"] {
		add = append(add, propagation.TraceContext{})
	}
	if !has["baggage"] {
		add = append(add, propagation.Baggage{})
	}
	switch {
	case len(add) == 0:
		return cur
	case len(has) == 0: // nothing set (the global default delegates to what is set next)
		return propagation.NewCompositeTextMapPropagator(add...)
	}
	return propagation.NewCompositeTextMapPropagator(append([]propagation.TextMapPropagator{cur}, add...)...)
}
