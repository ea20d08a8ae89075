package lanesgrpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"

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

	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()

	lease, err := reg.Register(ctx, inst, c.ttl)
	if err != nil {
		srv.Stop()
		<-served
		return fmt.Errorf("lanesgrpc: register %s/%s: %w", inst.Service, inst.ID, err)
	}
	log := c.log.With("service", inst.Service, "id", inst.ID)
	log.Info("lanes: instance registered", "addr", inst.Addr, "lane", inst.Lane, "zone", inst.Zone, "guard", c.guard != nil)

	select {
	case <-ctx.Done():
		if err := lease.Close(); err != nil {
			log.Warn("lanes: deregistration failed; the lease will expire", "err", err)
		}
		sleep(c.drain)
		stop(srv, c.shutdown)
		if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	case err := <-served:
		lease.Close()
		if err == nil {
			err = errors.New("lanesgrpc: the server was stopped")
		}
		return err
	case <-lease.Done():
		log.Error("lanes: registration lost; stopping", "err", lease.Err())
		lease.Close() // releases what the backend still holds
		stop(srv, c.shutdown)
		<-served
		return fmt.Errorf("lanesgrpc: registration of %s/%s lost: %w", inst.Service, inst.ID, lease.Err())
	}
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

func sleep(d time.Duration) {
	if d > 0 {
		time.Sleep(d)
	}
}
