package lanesgrpc

import (
	"context"
	"fmt"
	"net"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"

	"github.com/lanesdev/lanes/internal/lib/instdial"
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
// WithDialOptions. Its dialer refuses to connect to a link-local or cloud
// metadata address (169.254.0.0/16, fe80::/10, fd00:ec2::254,
// 100.100.100.200: an instance address is what whoever registered it chose),
// checked on the IP actually dialled; such an instance never becomes ready,
// and the picker moves on. A grpc.WithContextDialer of WithDialOptions
// replaces it. Like grpc.NewClient it does not connect; the first call
// does. Close the connection when done.
func NewClient(e *routing.Engine, service string, opts ...ClientOption) (*grpc.ClientConn, error) {
	if err := registry.CheckService(service); err != nil {
		return nil, fmt.Errorf("lanesgrpc: %w", err)
	}
	cfg := clientConfig(opts)
	if _, err := parseMethods(cfg.idempotent); err != nil {
		return nil, err
	}
	dopts := []grpc.DialOption{grpc.WithContextDialer(dialer)}
	dopts = append(dopts, cfg.dialOpts...)
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

// dialer connects to an instance, refusing the addresses that addrpolicy's
// zero rules refuse, as gRPC's own dialer does otherwise (TCP, no
// timeout of its own: the connection attempt's context bounds it), through
// LANES_DIAL's proxy when it is set (instdial).
func dialer(ctx context.Context, addr string) (net.Conn, error) {
	return defaultDialer(ctx, "tcp", addr)
}

var defaultDialer = instdial.Dialer(&net.Dialer{})
