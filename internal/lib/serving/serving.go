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
	"net"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/lanesdev/lanes/internal/lib/guard"
	"github.com/lanesdev/lanes/internal/lib/traceexport"
	"github.com/lanesdev/lanes/lanestrace"
	"github.com/lanesdev/lanes/registry"
)

// Server is what Run needs of a transport's server: *http.Server and
// *grpc.Server both are.
type Server interface {
	// Serve serves on the listener until the server stops; it must return
	// once Options.Stop ran.
	Serve(net.Listener) error
}

// Options are the placement and registration settings of Run.
type Options struct {
	// Name prefixes errors, for example "laneshttp".
	Name string
	// Stop stops the server gracefully, within a bound of its own, and
	// returns what went wrong.
	Stop func() error
	// Closed is the error Serve returns after Stop, which is no failure
	// (http.ErrServerClosed, grpc.ErrServerStopped).
	Closed error

	// Lane and Zone place the instance when it does not set them, before
	// the LANES_* variables (read with Getenv); Zone only when ZoneSet.
	Lane    string
	Zone    string
	ZoneSet bool
	Getenv  func(string) string

	TTL    time.Duration // the lease of the registration
	Drain  time.Duration // how long to serve on after deregistering
	Logger *slog.Logger
	// Path is the instance's data path (registry.LabelPath), set when the
	// instance does not say it: "" is registry.PathSDK.
	Path string
	// Guard, when set, is the provider-side guard of the server: Run
	// tells it the instance before serving. A lane instance without one
	// is logged.
	Guard *guard.Guard
}

// Run places inst (registry.Place: the instance's own fields, then o, then
// the LANES_* variables, then the listener's address, see advertised),
// tells the guard,
// serves s and registers inst in reg, until ctx is done. Then it
// deregisters inst, serves on for o.Drain, stops s and returns nil or what
// stopping found. It returns early, after stopping s, with the error of a
// registration that fails or is lost, or of s.Serve; and at once, closing
// the listener, when inst is invalid.
func Run(ctx context.Context, reg registry.Registry, inst registry.Instance, lis net.Listener, srv Server, o Options) error {
	zone := ""
	if o.ZoneSet {
		zone = o.Zone
	}
	addr, from := advertised(reg, inst, o.Getenv, lis.Addr())
	inst = withPath(inst, o.Path)
	inst, err := registry.Place(inst, o.Lane, zone, o.Getenv, addr)
	if err != nil {
		lis.Close()
		return fmt.Errorf("%s: instance: %w", o.Name, err)
	}
	if o.Guard != nil {
		o.Guard.SetInstance(inst)
	} else if inst.Lane != "" {
		o.Logger.Warn("lanes: no guard given (WithGuard): a lane instance serves whatever reaches it", "service", inst.Service, "lane", inst.Lane)
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }() // owned by Run: every return waits for it

	lease, err := reg.Register(ctx, inst, o.TTL)
	if err != nil {
		o.Stop()
		<-served
		return fmt.Errorf("%s: register %s/%s: %w", o.Name, inst.Service, inst.ID, err)
	}
	if o.Guard != nil {
		// As the registry keeps it: with the scope of the credential that
		// registered it, which decides the tag rules that apply to it.
		o.Guard.SetInstance(lease.Instance())
	}
	identify(inst)
	log := o.Logger.With("service", inst.Service, "id", inst.ID)
	log.Info("lanes: instance registered", "addr", inst.Addr, "addr_from", from, "lane", inst.Lane, "zone", inst.Zone, "guard", o.Guard != nil)

	select {
	case <-ctx.Done():
		// Deregister first, so that callers stop picking this instance,
		// and serve on while they learn it.
		if err := lease.Close(); err != nil {
			log.Warn("lanes: deregistration failed; the lease will expire", "err", err)
		} else {
			log.Info("lanes: instance deregistered; stopping the server", "drain", o.Drain.String())
		}
		if o.Drain > 0 {
			time.Sleep(o.Drain)
		}
		err := o.Stop()
		if e := <-served; e != nil && !errors.Is(e, o.Closed) && err == nil {
			err = e
		}
		return err
	case err := <-served:
		lease.Close()
		if err == nil {
			err = fmt.Errorf("%s: the server was stopped", o.Name)
		}
		return err
	case <-lease.Done():
		log.Error("lanes: registration lost; stopping", "err", lease.Err())
		lease.Close() // releases what the backend still holds
		o.Stop()
		<-served
		return fmt.Errorf("%s: registration of %s/%s lost: %w", o.Name, inst.Service, inst.ID, lease.Err())
	}
}

// identify names the spans that this process exports through lanestrace.FromEnv after inst: its
// service, not the program's name, and its lane.
func identify(inst registry.Instance) {
	attrs := []attribute.KeyValue{semconv.ServiceName(inst.Service)}
	if inst.Lane != "" {
		attrs = append(attrs, lanestrace.InstanceLane.String(inst.Lane))
	}
	traceexport.Identify(attrs...)
}

// advertised returns the listener address that Place defaults the
// instance's address to, and says where the address registered comes from
// (for the log): Instance.Addr, LANES_ADDR, or the listener. A listener on
// an unspecified IP (":8080") advertises the local IP of the process's route
// to the registry when reg is a registry.Reacher (the address the control
// plane's side reaches back), else the host's first address.
func advertised(reg registry.Registry, inst registry.Instance, getenv func(string) string, lis net.Addr) (net.Addr, string) {
	switch {
	case inst.Addr != "":
		return lis, "Instance.Addr"
	case getenv != nil && strings.TrimSpace(getenv(registry.EnvAddr)) != "":
		return lis, registry.EnvAddr
	}
	tcp, ok := lis.(*net.TCPAddr)
	if !ok || tcp.IP != nil && !tcp.IP.IsUnspecified() {
		return lis, "the listener"
	}
	if r, ok := reg.(registry.Reacher); ok {
		if ip := r.LocalIP(); ip != nil {
			return &net.TCPAddr{IP: ip, Port: tcp.Port}, "the route to the registry"
		}
	}
	return lis, "the host's first address"
}

// withPath labels inst with its data path unless it says one itself (its
// Labels are copied: the caller's map is left alone).
func withPath(inst registry.Instance, path string) registry.Instance {
	if _, ok := inst.Labels[registry.LabelPath]; ok {
		return inst
	}
	if path == "" {
		path = registry.PathSDK
	}
	labels := make(map[string]string, len(inst.Labels)+1)
	for k, v := range inst.Labels {
		labels[k] = v
	}
	labels[registry.LabelPath] = path
	inst.Labels = labels
	return inst
}
