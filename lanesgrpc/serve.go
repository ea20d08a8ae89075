package lanesgrpc

import (
	"context"
	"net"
	"time"

	"google.golang.org/grpc"

	"github.com/lanesdev/lanes/internal/lib/guard"
	"github.com/lanesdev/lanes/internal/lib/serving"
	"github.com/lanesdev/lanes/registry"
)

// Serve runs srv on lis as an instance of a lanes service, until ctx is done.
//
//  1. It places the instance: fields set in inst win, then WithLane and
//     WithZone, then the LANES_* variables (registry.ApplyEnv, read through
//     WithEnv; LANES_LANE, LANES_ZONE, LANES_ADDR, ...). The address
//     defaults to the listener's (an unspecified IP such as 0.0.0.0 is
//     replaced by the local IP of the route to reg, a registry.Reacher, else
//     by this host's first non-loopback address). inst.Service is
//     required. The guard is told the instance: the WithGuard guard of
//     NewServer or of Serve; else, for a server made by NewServer, one on
//     the engine of a lanesenv.Env whose Registry reg is, unless
//     WithoutGuard (given to either).
//  2. It starts serving on lis, then registers the instance in reg (with
//     WithTTL's lease).
//  3. When ctx is done it deregisters the instance first, so that callers
//     stop choosing it, waits WithDrainDelay, then stops srv gracefully:
//     calls in flight may finish within WithShutdownTimeout, after which srv
//     is stopped hard. It returns nil.
//
// It returns early, after stopping srv, with the error of a registration
// that fails or is lost, or of srv.Serve. Like grpc.Server.Serve, it closes
// lis.
//
// The server interceptors cannot be added here: make the server with
// NewServer, or give ServerOptions to grpc.NewServer and the same guard to
// both with WithGuard (a server made otherwise gets no default guard).
func Serve(ctx context.Context, srv *grpc.Server, lis net.Listener, reg registry.Registry, inst registry.Instance, opts ...ServerOption) error {
	c := serverConfig(opts)
	if v, ok := servers.LoadAndDelete(srv); ok { // made by NewServer
		si := v.(*serverInterceptor)
		switch g := si.guard.Load(); {
		case g != nil && c.guard == nil:
			c.guard = g
		case g == nil && c.guard == nil && !c.noGuard && !si.noGuard:
			c.guard = guard.For(reg) // the engine lanesenv.Open made on reg
			si.guard.Store(c.guard)
		case g == nil && c.guard != nil:
			si.guard.Store(c.guard)
		}
	}
	return serving.Run(ctx, reg, inst, lis, srv, c.serving("lanesgrpc", func() error { stop(srv, c.shutdown); return nil }, grpc.ErrServerStopped))
}

// stop stops srv gracefully, and hard after timeout (if positive).
func stop(srv *grpc.Server, timeout time.Duration) {
	done := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(done)
	}()
	if timeout <= 0 {
		<-done
		return
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		srv.Stop()
		<-done
	}
}
