// Package traceexport is the export of spans to the trace collector of lanes up, written once:
// the exporter of lanestrace.FromEnv (LANES_TRACES), and the tracer providers of the control
// plane and of lanes demo, which run several services in one process and give each its own.
package traceexport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"google.golang.org/grpc/credentials"
)

// BatchTimeout is how long spans for lanes' collector wait to be sent in a batch: short, so that
// `lanes trace` shows a request soon after it ended.
const BatchTimeout = 500 * time.Millisecond

// NewProvider returns a tracer provider of service that exports, in batches, to the trace
// collector of lanes up at addr (in LANES_TRACES's form: host:port or an http(s):// URL), with
// token as its credential ("" for none) and an https:// addr verified with tc (nil: the system's
// roots), sampled with sampler (lanestrace.Sampler). It sets no global. Shut it down to flush
// its spans.
func NewProvider(ctx context.Context, service, addr string, sampler sdktrace.Sampler, token string, tc *tls.Config) (*sdktrace.TracerProvider, error) {
	exp, err := Exporter(ctx, addr, token, tc)
	if err != nil {
		return nil, fmt.Errorf("trace collector %q: %w", addr, err)
	}
	res, err := Resource(service)
	if err != nil {
		return nil, err
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(BatchTimeout)),
		sdktrace.WithResource(res), sdktrace.WithSampler(sampler)), nil
}

// Resource is the resource of service's spans.
func Resource(service string) (*resource.Resource, error) {
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	if err != nil && !errors.Is(err, resource.ErrPartialResource) && !errors.Is(err, resource.ErrSchemaURLConflict) {
		return nil, fmt.Errorf("resource: %w", err)
	}
	return res, nil
}

// Exporter exports to lanes' collector at addr (host:port, plain; or a URL), with token as its
// credential ("" for none), sent as "Authorization: Bearer <token>"; an https:// addr is
// verified with tc, or the system's roots when tc is nil. Its errors do not repeat addr.
func Exporter(ctx context.Context, addr, token string, tc *tls.Config) (sdktrace.SpanExporter, error) {
	opts := []otlptracegrpc.Option{otlptracegrpc.WithTimeout(5 * time.Second)}
	if token != "" {
		opts = append(opts, otlptracegrpc.WithHeaders(map[string]string{"authorization": "Bearer " + token}))
	}
	switch {
	case strings.HasPrefix(addr, "https://"):
		opts = append(opts, otlptracegrpc.WithEndpointURL(addr))
		if tc != nil {
			opts = append(opts, otlptracegrpc.WithTLSCredentials(credentials.NewTLS(tc)))
		}
	case strings.HasPrefix(addr, "http://"):
		opts = append(opts, otlptracegrpc.WithEndpointURL(addr), otlptracegrpc.WithInsecure())
	default:
		if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
			return nil, errors.New("want host:port or an http(s):// URL")
		}
		opts = append(opts, otlptracegrpc.WithEndpoint(addr), otlptracegrpc.WithInsecure())
	}
	return otlptracegrpc.New(ctx, opts...)
}
