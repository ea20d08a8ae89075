package lanesgrpc

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"

	"github.com/lanesdev/lanes/internal/lib/serving"
	"github.com/lanesdev/lanes/registry"
)

// Serve runs srv on lis as an instance of a lanes service, until ctx is done.
//
//  1. It places the instance: fields set in inst win, then WithLane and
//     WithZone, then the LANES_* variables (registry.ApplyEnv, read through
//     WithEnv; LANES_LANE, LANES_ZONE, LANES_ADDR, ...). The address
//     defaults to the listener's (an unspecified IP such as 0.0.0.0 is
//     replaced by this host's first non-loopback address). inst.Service is
//     required. A WithGuard guard is told the instance.
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
// The server interceptors cannot be added here: give them to grpc.NewServer
// (ServerOptions), with the same guard as Serve's WithGuard.
func Serve(ctx context.Context, srv *grpc.Server, lis net.Listener, reg registry.Registry, inst registry.Instance, opts ...Option) error {
	c := newConfig(opts)
	inst, err := place(inst, c, lis.Addr())
	if err != nil {
		lis.Close()
		return err
	}
	if c.guard != nil {
		c.guard.SetInstance(inst)
	}

	return serving.Run(ctx, reg, inst, serving.Server{
		Name:   "lanesgrpc",
		Serve:  func() error { return srv.Serve(lis) },
		Stop:   func() error { stop(srv, c.shutdown); return nil },
		Closed: grpc.ErrServerStopped,
	}, serving.Options{TTL: c.ttl, Drain: c.drain, Logger: c.log, Guard: c.guard != nil})
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
		return inst, fmt.Errorf("lanesgrpc: instance: %w", err)
	}
	return inst, nil
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
