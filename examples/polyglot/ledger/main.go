// Command ledger is the Go service of the polyglot example: a gRPC server that joins lanes with
// the SDK (lanesenv, lanesgrpc) as docs/grpc.md shows. It serves polyglot.Ledger
// (proto/polyglot.proto) and answers with the hop that served the call.
package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesenv"
	"github.com/lanesdev/lanes/lanesgrpc"
	"github.com/lanesdev/lanes/registry"
)

// hop is who served a call: the service, the lane of its instance, the lane the call carried.
type hop struct {
	Service string `json:"service"`
	Lane    string `json:"lane"`
	Request string `json:"request"`
}

func record(ctx context.Context, _ *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	b, err := json.Marshal([]hop{{Service: "ledger", Lane: os.Getenv(registry.EnvLane), Request: lane.FromContext(ctx)}})
	if err != nil {
		return nil, err
	}
	return wrapperspb.String(string(b)), nil
}

// ledgerService describes polyglot.Ledger by hand: its one method takes and returns the
// well-known StringValue, so that no generated code is needed.
var ledgerService = grpc.ServiceDesc{
	ServiceName: "polyglot.Ledger",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Record", Handler: func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.StringValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		if ic == nil {
			return record(ctx, in)
		}
		return ic(ctx, in, &grpc.UnaryServerInfo{FullMethod: "/polyglot.Ledger/Record"}, func(ctx context.Context, req any) (any, error) {
			return record(ctx, req.(*wrapperspb.StringValue))
		})
	}}},
	Metadata: "polyglot.proto",
}

func main() {
	if err := run(); err != nil {
		slog.Error("ledger stopped", "err", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	env, err := lanesenv.Open(ctx) // reads LANES_REGISTRY, as `lanes up` prints it
	if err != nil {
		return err
	}
	defer env.Close()
	slog.SetDefault(env.Logger)

	srv := lanesgrpc.NewServer()
	srv.RegisterService(&ledgerService, struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	return lanesgrpc.Serve(ctx, srv, lis, env.Registry, registry.Instance{Service: "ledger"})
}
