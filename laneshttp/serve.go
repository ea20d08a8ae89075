package laneshttp

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"github.com/lanesdev/lanes/internal/lib/guard"
	"github.com/lanesdev/lanes/internal/lib/serving"
	"github.com/lanesdev/lanes/registry"
)

// shutdown shuts srv down gracefully within the shutdown timeout, then
// closes it.
func shutdown(ctx context.Context, srv *http.Server, c *config) error {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.shutdown)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
		return fmt.Errorf("laneshttp: shutdown: %w", err)
	}
	return nil
}

// Serve runs srv on lis as an instance of a lanes service, until ctx is done.
//
//  1. It places the instance: fields set in inst win, then WithLane and
//     WithZone, then the LANES_* variables (registry.ApplyEnv; LANES_LANE,
//     LANES_ZONE, LANES_ADDR, ...), and the address defaults to the
//     listener's (an unspecified IP such as 0.0.0.0 is replaced by the
//     local IP of the route to reg, a registry.Reacher, else by this host's
//     first non-loopback address). inst.Service is required.
//  2. It replaces srv.Handler (http.DefaultServeMux when nil) with the
//     Middleware of Handler, with a guard: the WithGuard guard, else one on
//     the engine of a lanesenv.Env whose Registry reg is, unless
//     WithoutGuard. The guard is told the instance.
//  3. It starts serving on lis, then registers the instance in reg.
//  4. When ctx is done it deregisters the instance first, waits
//     WithDrainDelay, then shuts srv down gracefully (WithShutdownTimeout,
//     after which srv is closed), and returns nil.
//
// It returns early, after shutting down, with the error of a registration
// that fails or is lost, or of srv.Serve. Serve closes lis.
//
// Options: WithLane, WithZone, WithEnv, WithTTL, WithGuard, WithoutGuard,
// WithExemptPaths, WithPropagator, WithLogger, WithDrainDelay,
// WithShutdownTimeout.
func Serve(ctx context.Context, srv *http.Server, lis net.Listener, reg registry.Registry, inst registry.Instance, opts ...ServerOption) error {
	c := serverConfig(opts)
	if c.guard == nil && !c.noGuard {
		c.guard = guard.For(reg) // the engine lanesenv.Open made on reg
	}
	if srv.Handler == nil {
		srv.Handler = http.DefaultServeMux
	}
	srv.Handler = newMiddleware(srv.Handler, c)
	return serving.Run(ctx, reg, inst, lis, srv, c.serving("laneshttp", func() error { return shutdown(ctx, srv, c) }, http.ErrServerClosed))
}
