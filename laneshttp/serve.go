package laneshttp

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"github.com/lanesdev/lanes/internal/lib/serving"
	"github.com/lanesdev/lanes/registry"
)

// Serve runs srv on lis as an instance of a lanes service, until ctx is done.
//
//  1. It places the instance: fields set in inst win, then WithLane and
//     WithZone, then the LANES_* variables (registry.ApplyEnv; LANES_LANE,
//     LANES_ZONE, LANES_ADDR, ...), and the address defaults to the
//     listener's (an unspecified IP such as 0.0.0.0 is replaced by this
//     host's first non-loopback address). inst.Service is required.
//  2. It replaces srv.Handler (http.DefaultServeMux when nil) with the
//     Middleware of Handler, guarded for the instance when WithEngine is
//     given and WithoutGuard is not.
//  3. It starts serving on lis, then registers the instance in reg.
//  4. When ctx is done it deregisters the instance first, waits
//     WithDrainDelay, then shuts srv down gracefully (WithShutdownTimeout,
//     after which srv is closed), and returns nil.
//
// It returns early, after shutting down, with the error of a registration
// that fails or is lost, or of srv.Serve. Serve closes lis.
//
// Options: WithLane, WithZone, WithEnv, WithTTL, WithEngine, WithoutGuard,
// WithExemptPaths, WithPropagator, WithLogger, WithDrainDelay,
// WithShutdownTimeout.
func Serve(ctx context.Context, srv *http.Server, lis net.Listener, reg registry.Registry, inst registry.Instance, opts ...Option) error {
	c := newConfig(opts)
	inst, err := place(inst, c, lis.Addr())
	if err != nil {
		lis.Close()
		return err
	}
	next := srv.Handler
	if next == nil {
		next = http.DefaultServeMux
	}
	if c.engine != nil && !c.noGuard {
		c.guardIn = &inst
	} else if !c.noGuard && inst.Lane != "" {
		c.log.Warn("lanes: no engine given (WithEngine): the guard is off", "service", inst.Service, "lane", inst.Lane)
	}
	mw := newMiddleware(next, c)
	srv.Handler = mw

	return serving.Run(ctx, reg, inst, serving.Server{
		Name:   "laneshttp",
		Serve:  func() error { return srv.Serve(lis) },
		Stop:   func() error { return shutdown(ctx, srv, c) },
		Closed: http.ErrServerClosed,
	}, serving.Options{TTL: c.ttl, Drain: c.drain, Logger: c.log, Guard: mw.Guarded()})
}

// place fills the instance from the options, the environment and the
// listener, and normalises it.
func place(inst registry.Instance, c *config, addr net.Addr) (registry.Instance, error) {
	zone := ""
	if c.zoneSet {
		zone = c.zone
	}
	inst, err := registry.Place(inst, c.lane, zone, c.getenv, addr)
	if err != nil {
		return inst, fmt.Errorf("laneshttp: instance: %w", err)
	}
	return inst, nil
}

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
