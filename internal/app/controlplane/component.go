package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lanesdev/lanes/internal/lib/addrpolicy"
)

// A Component is one part of the control plane: the data directory's lock,
// etcd, NATS, the routing engine, the claims watch, the gateway, the admin
// API. A component declares what it needs from the others and what it
// provides them (Needs and Provides, as typed keys); the control plane
// orders the components by these declarations, and a component may read
// only what it needs and give only what it provides.
//
// The lifecycle follows Caddy's modules:
//
//  1. Validate checks the component's part of the configuration, for every
//     component, before any component is provisioned. It is fast and
//     starts nothing;
//  2. Provision sets the component up from the configuration and what it
//     needs, and provides what it provides (it may open listeners and start
//     embedded servers, which is how later components learn addresses), in
//     dependency order;
//  3. Start begins serving, in dependency order; it must not block;
//  4. Stop stops serving gracefully within ctx, in reverse order;
//  5. Cleanup releases what Provision acquired, in reverse order. It runs
//     for every component whose Provision ran, also when a later step
//     failed.
//
// Name, Needs and Provides are required; a component implements the steps
// it needs.
type Component interface {
	Name() string
	// Needs lists the keys that Provision reads with Need.
	Needs() []Dep
	// Provides lists the keys that Provision gives with Provide; it must
	// give each one.
	Provides() []Dep
}

// Validator is a component with a Validate step.
type Validator interface {
	Validate(cfg *Config) error
}

// Provisioner is a component with a Provision step.
type Provisioner interface {
	Provision(ctx context.Context, rt *Runtime) error
}

// Starter is a component that serves.
type Starter interface {
	Start(ctx context.Context) error
}

// Stopper is a component that stops serving gracefully.
type Stopper interface {
	Stop(ctx context.Context) error
}

// CleanerUpper is a component that releases resources.
type CleanerUpper interface {
	Cleanup() error
}

// A Key names a value of type T that one component provides to the ones
// that need it.
type Key[T any] struct{ name string }

func (k Key[T]) key() string { return k.name }

// String returns the key's name.
func (k Key[T]) String() string { return k.name }

// Dep is a Key of any type, as Needs and Provides list them.
type Dep interface {
	key() string
	String() string
}

// Need returns the value of k, which a component declared in its Needs
// (the control plane provisioned its provider first). Reading a key that the
// component did not declare is a programming error: Need panics, naming
// both.
func Need[T any](rt *Runtime, k Key[T]) T {
	if !rt.needs[k.name] {
		panic(fmt.Sprintf("controlplane: component %s reads %s, which it does not list in Needs", rt.comp, k.name))
	}
	return rt.shared.vals[k.name].(T)
}

// Provide gives the value of k, which a component declared in its
// Provides. Giving a key that it did not declare is a programming error:
// Provide panics, naming both.
func Provide[T any](rt *Runtime, k Key[T], v T) {
	if !rt.provides[k.name] {
		panic(fmt.Sprintf("controlplane: component %s provides %s, which it does not list in Provides", rt.comp, k.name))
	}
	rt.shared.vals[k.name] = v
}

// Runtime is one component's view of the running control plane: the
// configuration, the logger and the metrics registry that every component
// gets, and, through Need and Provide, the values it declared.
type Runtime struct {
	Config Config
	Log    *slog.Logger
	// Metrics is the Prometheus registry served at the admin API's
	// /metrics.
	Metrics *prometheus.Registry

	comp     string
	needs    map[string]bool
	provides map[string]bool
	shared   *shared
}

// shared is what the views of one control plane share.
type shared struct {
	vals      map[string]any
	addresses []Address
	fatal     chan error
	// listeners are the control plane's own listeners, which no instance
	// address may reach (addrpolicy): every component that listens says
	// so with Runtime.Listen or Runtime.Listening.
	listeners addrpolicy.Reserved
}

// Listen opens a TCP listener on addr for what (the setting is
// --<what>-addr, named in errors), and records it among the control
// plane's listeners, which no instance address may reach.
func (rt *Runtime) Listen(what, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s (--%s-addr): %w", addr, what, err)
	}
	if err := rt.Listening(context.Background(), what, ln.Addr()); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// Listening records a listener of the control plane that a component
// opened otherwise (an embedded server's), or a server it uses (an
// external etcd): addr is a net.Addr, "host:port" or a URL.
func (rt *Runtime) Listening(ctx context.Context, name string, addr any) error {
	if s, ok := addr.(string); ok && strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil {
			return fmt.Errorf("%s: %q: %w", name, s, err)
		}
		addr = u.Host
	}
	ctx, cancel := context.WithTimeout(ctx, addrpolicy.DefaultResolveTimeout)
	defer cancel()
	return rt.shared.listeners.Add(ctx, name, addr)
}

// Reserved returns the control plane's listeners, as they are recorded.
func (rt *Runtime) Reserved() *addrpolicy.Reserved { return &rt.shared.listeners }

// Announce adds an address to those printed at start-up.
func (rt *Runtime) Announce(a Address) {
	rt.shared.addresses = append(rt.shared.addresses, a)
}

// Fail reports that a running component has failed; the control plane
// stops.
func (rt *Runtime) Fail(err error) {
	select {
	case rt.shared.fatal <- err:
	default:
	}
}

// lifecycle runs components through their steps and back.
type lifecycle struct {
	comps       []Component // in dependency order
	views       []*Runtime
	sh          *shared
	provisioned int // components whose Provision ran (even if it failed)
	started     int
	progress    io.Writer // where start-up says what it does; nil: nowhere
}

// plan orders comps by their dependencies: a component comes after the
// providers of what it needs, and otherwise keeps its place in comps. It
// refuses a need that nothing provides, a key provided twice and a cycle.
func plan(comps []Component) ([]Component, error) {
	provider := map[string]int{}
	for i, c := range comps {
		for _, d := range c.Provides() {
			if j, dup := provider[d.key()]; dup {
				return nil, fmt.Errorf("controlplane: %s is provided by both %s and %s", d, comps[j].Name(), c.Name())
			}
			provider[d.key()] = i
		}
	}
	for _, c := range comps {
		for _, d := range c.Needs() {
			if _, ok := provider[d.key()]; !ok {
				return nil, fmt.Errorf("controlplane: %s needs %s, which no component provides", c.Name(), d)
			}
		}
	}
	done := make([]bool, len(comps))
	var out []Component
	for len(out) < len(comps) {
		next := -1
		for i, c := range comps {
			if done[i] {
				continue
			}
			ready := true
			for _, d := range c.Needs() {
				if !done[provider[d.key()]] {
					ready = false
					break
				}
			}
			if ready {
				next = i
				break
			}
		}
		if next < 0 {
			var left []string
			for i, c := range comps {
				if !done[i] {
					left = append(left, c.Name())
				}
			}
			return nil, fmt.Errorf("controlplane: the components %s need each other in a cycle", strings.Join(left, ", "))
		}
		done[next] = true
		out = append(out, comps[next])
	}
	return out, nil
}

// newLifecycle plans comps and makes each one's view of the runtime.
func newLifecycle(comps []Component, cfg Config, log *slog.Logger) (*lifecycle, error) {
	ordered, err := plan(comps)
	if err != nil {
		return nil, err
	}
	l := &lifecycle{comps: ordered, sh: &shared{vals: map[string]any{}, fatal: make(chan error, 1)}}
	metrics := prometheus.NewRegistry()
	for _, c := range ordered {
		v := &Runtime{Config: cfg, Log: log, Metrics: metrics, comp: c.Name(), needs: map[string]bool{}, provides: map[string]bool{}, shared: l.sh}
		for _, d := range c.Needs() {
			v.needs[d.key()] = true
		}
		for _, d := range c.Provides() {
			v.provides[d.key()] = true
		}
		l.views = append(l.views, v)
	}
	return l, nil
}

// validate runs every component's Validate on cfg; it starts nothing.
func validate(comps []Component, cfg *Config) error {
	for _, c := range comps {
		if v, ok := c.(Validator); ok {
			if err := v.Validate(cfg); err != nil {
				return err
			}
		}
	}
	return nil
}

// up validates every component, then provisions and starts them in order.
// On failure it undoes what it did and returns the error, naming the
// component.
func (l *lifecycle) up(ctx context.Context) error {
	cfg := l.views[0].Config
	if err := validate(l.comps, &cfg); err != nil {
		return err
	}
	for i, c := range l.comps {
		l.provisioned++
		if l.progress != nil {
			if msg := startingLine(c.Name(), cfg); msg != "" {
				fmt.Fprintln(l.progress, "lanes: "+msg)
			}
		}
		if p, ok := c.(Provisioner); ok {
			if err := p.Provision(ctx, l.views[i]); err != nil {
				return l.fail(fmt.Errorf("%s: %w", c.Name(), err))
			}
		}
		for _, d := range c.Provides() {
			if _, ok := l.sh.vals[d.key()]; !ok {
				return l.fail(fmt.Errorf("%s: provisioned without providing %s", c.Name(), d))
			}
		}
	}
	for _, c := range l.comps {
		if s, ok := c.(Starter); ok {
			if err := s.Start(ctx); err != nil {
				return l.fail(fmt.Errorf("%s: start: %w", c.Name(), err))
			}
		}
		l.started++
	}
	return nil
}

func (l *lifecycle) fail(err error) error {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	return errors.Join(err, l.down(ctx))
}

// down stops the started components and cleans up the provisioned ones, in
// reverse order.
func (l *lifecycle) down(ctx context.Context) error {
	var errs []error
	for i := l.started - 1; i >= 0; i-- {
		if s, ok := l.comps[i].(Stopper); ok {
			if err := s.Stop(ctx); err != nil {
				errs = append(errs, fmt.Errorf("%s: stop: %w", l.comps[i].Name(), err))
			}
		}
	}
	l.started = 0
	for i := l.provisioned - 1; i >= 0; i-- {
		if c, ok := l.comps[i].(CleanerUpper); ok {
			if err := c.Cleanup(); err != nil {
				errs = append(errs, fmt.Errorf("%s: cleanup: %w", l.comps[i].Name(), err))
			}
		}
	}
	l.provisioned = 0
	return errors.Join(errs...)
}

// names returns the components' names in order, for messages and tests.
func names(comps []Component) []string {
	out := make([]string, 0, len(comps))
	for _, c := range comps {
		out = append(out, c.Name())
	}
	return slices.Clip(out)
}
