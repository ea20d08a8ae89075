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

// Serve runs srv on lis as an instance of inst.Service, registered in reg
// while it serves, until ctx is done.
//
// It places the instance first: WithLane and WithZone win over the fields of
// inst, which win over the LANES_* variables (registry.ApplyEnv, read with
// WithGetenv's function or os.Getenv); Addr defaults to the listener's
// address, which must then have a routable host (listen on a given IP, or set
// Addr or LANES_ADDR). A WithGuard guard is told the instance before the
// server accepts connections.
//
// It then starts serving and registers the instance (with WithTTL's lease).
// When ctx is done it deregisters first, so that callers stop choosing the
// instance, then stops the server gracefully: calls in flight may finish
// within WithGracePeriod, after which the server is stopped hard.
//
// Like grpc.Server.Serve, Serve closes lis when it returns. It returns nil
// after a shutdown through ctx; an error if the instance
// cannot be placed or registered (the server is then stopped), or if srv
// stopped serving by itself (the instance is then deregistered). If the
// registry gives up the lease while serving, Serve logs it and keeps
// serving.
func Serve(ctx context.Context, srv *grpc.Server, lis net.Listener, reg registry.Registry, inst registry.Instance, opts ...Option) error {
	cfg := newConfig(opts)
	inst, err := place(inst, lis, cfg)
	if err != nil {
		lis.Close()
		return err
	}
	if cfg.guard != nil {
		cfg.guard.SetInstance(inst)
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()

	lease, err := reg.Register(ctx, inst, cfg.ttl)
	if err != nil {
		srv.Stop()
		<-served
		return fmt.Errorf("lanesgrpc: register %s/%s: %w", inst.Service, inst.ID, err)
	}
	log := cfg.log.With("service", inst.Service, "id", inst.ID, "addr", inst.Addr, "lane", inst.Lane)
	log.Info("lanes: serving and registered")

	var serveErr error
	stopped := false
	leaseDone := lease.Done()
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case serveErr = <-served:
			stopped = true
			break wait
		case <-leaseDone:
			log.Error("lanes: registration lost; still serving", "err", lease.Err())
			leaseDone = nil
		}
	}

	if err := lease.Close(); err != nil {
		log.Warn("lanes: deregistration failed; the lease will expire", "err", err)
	}
	if stopped {
		if serveErr == nil {
			serveErr = errors.New("lanesgrpc: server stopped")
		}
		return serveErr
	}
	gracefulStop(srv, cfg.grace)
	if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	log.Info("lanes: deregistered and stopped")
	return nil
}

// place resolves the instance to register.
func place(inst registry.Instance, lis net.Listener, cfg *config) (registry.Instance, error) {
	if cfg.zone != "" {
		inst.Zone = cfg.zone
	}
	if cfg.laneSet {
		inst.Lane = cfg.lane
	}
	placed, err := registry.ApplyEnv(inst, cfg.getenv)
	if err != nil {
		return inst, fmt.Errorf("lanesgrpc: %w", err)
	}
	if cfg.laneSet {
		placed.Lane = cfg.lane // even "": the option wins over LANES_LANE
	}
	if placed.Addr == "" {
		a, ok := lis.Addr().(*net.TCPAddr)
		if !ok || a.IP == nil || a.IP.IsUnspecified() {
			return inst, fmt.Errorf("lanesgrpc: listener address %s has no routable host: set Instance.Addr or %s", lis.Addr(), registry.EnvAddr)
		}
		placed.Addr = a.String()
	}
	placed, err = registry.Normalize(placed)
	if err != nil {
		return inst, fmt.Errorf("lanesgrpc: %w", err)
	}
	return placed, nil
}

// gracefulStop stops srv gracefully, and hard after grace (if positive).
func gracefulStop(srv *grpc.Server, grace time.Duration) {
	done := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(done)
	}()
	if grace <= 0 {
		<-done
		return
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		srv.Stop()
		<-done
	}
}
