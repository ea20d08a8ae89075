package lanesgrpc

import (
	"fmt"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"

	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// NewClient returns a gRPC client of service that routes every call with e:
// grpc.NewClient("lanes:///"+service) with the lanes resolver (NewBuilder,
// which also selects the lanes balancer and the retry policy of
// WithIdempotent), and the lanes client interceptors, innermost, after any
// interceptor of WithDialOptions.
//
// NewClient chooses no transport credentials: pass them with
// WithDialOptions. Like grpc.NewClient it does not connect; the first call
// does. Close the connection when done.
func NewClient(e *routing.Engine, service string, opts ...ClientOption) (*grpc.ClientConn, error) {
	if err := registry.CheckService(service); err != nil {
		return nil, fmt.Errorf("lanesgrpc: %w", err)
	}
	cfg := clientConfig(opts)
	if _, err := parseMethods(cfg.idempotent); err != nil {
		return nil, err
	}
	dopts := append([]grpc.DialOption(nil), cfg.dialOpts...)
	if tp := cfg.tracerProvider(); tp != nil {
		dopts = append(dopts, grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(propagation.TraceContext{}))))
	}
	dopts = append(dopts,
		grpc.WithResolvers(NewBuilder(e, opts...)),
		grpc.WithChainUnaryInterceptor(UnaryClientInterceptor(opts...)),
		grpc.WithChainStreamInterceptor(StreamClientInterceptor(opts...)),
	)
	return grpc.NewClient(Scheme+":///"+service, dopts...)
}
