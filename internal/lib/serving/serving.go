// Package serving runs a server as a registered lanes instance: the
// lifecycle that every transport's Serve helper shares. It starts serving,
// registers the instance, and on the way out deregisters it before the server
// stops, so that callers stop choosing the instance while it still answers.
package serving

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/lanesdev/lanes/registry"
)

// Server is what Run needs of a transport's server.
type Server struct {
	// Name prefixes errors, for example "laneshttp".
	Name string
	// Serve serves until the server stops; it must return once Stop ran.
	Serve func() error
	// Stop stops the server gracefully, within a bound of its own, and
	// returns what went wrong.
	Stop func() error
	// Closed is the error Serve returns after Stop, which is no failure
	// (http.ErrServerClosed, grpc.ErrServerStopped).
	Closed error
}

// Options are the registration settings of Run.
type Options struct {
	TTL    time.Duration // the lease of the registration
	Drain  time.Duration // how long to serve on after deregistering
	Logger *slog.Logger
	Guard  bool // logged: whether the provider-side guard is on
}

// Run serves s and registers inst in reg, until ctx is done. Then it
// deregisters inst, serves on for o.Drain, stops s and returns nil or what
// stopping found. It returns early, after stopping s, with the error of a
// registration that fails or is lost, or of s.Serve.
func Run(ctx context.Context, reg registry.Registry, inst registry.Instance, s Server, o Options) error {
	served := make(chan error, 1)
	go func() { served <- s.Serve() }() // owned by Run: every return waits for it

	lease, err := reg.Register(ctx, inst, o.TTL)
	if err != nil {
		s.Stop()
		<-served
		return fmt.Errorf("%s: register %s/%s: %w", s.Name, inst.Service, inst.ID, err)
	}
	log := o.Logger.With("service", inst.Service, "id", inst.ID)
	log.Info("lanes: instance registered", "addr", inst.Addr, "lane", inst.Lane, "zone", inst.Zone, "guard", o.Guard)

	select {
	case <-ctx.Done():
		// Deregister first, so that callers stop picking this instance,
		// and serve on while they learn it.
		if err := lease.Close(); err != nil {
			log.Warn("lanes: deregistration failed; the lease will expire", "err", err)
		}
		if o.Drain > 0 {
			time.Sleep(o.Drain)
		}
		err := s.Stop()
		if e := <-served; e != nil && !errors.Is(e, s.Closed) && err == nil {
			err = e
		}
		return err
	case err := <-served:
		lease.Close()
		if err == nil {
			err = fmt.Errorf("%s: the server was stopped", s.Name)
		}
		return err
	case <-lease.Done():
		log.Error("lanes: registration lost; stopping", "err", lease.Err())
		lease.Close() // releases what the backend still holds
		s.Stop()
		<-served
		return fmt.Errorf("%s: registration of %s/%s lost: %w", s.Name, inst.Service, inst.ID, lease.Err())
	}
}
