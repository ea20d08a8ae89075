package controlplane

import (
	"context"
	"errors"
	"fmt"
)

// A Component is one part of the control plane: etcd, the routing engine,
// the claims watch, the gateway, the admin API — and later the dashboard,
// NATS and the trace collector. The lifecycle follows Caddy's modules:
//
//  1. Provision sets the component up from the configuration and the parts
//     provisioned before it (it may open listeners and connections, which
//     is how later components learn addresses), in order;
//  2. Validate checks the result, for every component, before anything
//     serves;
//  3. Start begins serving, in order; it must not block;
//  4. Stop stops serving gracefully within ctx, in reverse order;
//  5. Cleanup releases what Provision acquired, in reverse order. It runs
//     for every provisioned component, also when a later step failed.
//
// Only Name is required; a component implements the steps it needs.
type Component interface {
	Name() string
}

// Provisioner is a component with a Provision step.
type Provisioner interface {
	Provision(ctx context.Context, rt *Runtime) error
}

// Validator is a component with a Validate step.
type Validator interface {
	Validate() error
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

// lifecycle runs components through their steps and back.
type lifecycle struct {
	comps       []Component
	provisioned int // components whose Provision ran (even if it failed)
	started     int
}

// up provisions, validates and starts every component. On failure it undoes
// what it did and returns the error, naming the component.
func (l *lifecycle) up(ctx context.Context, rt *Runtime) error {
	for _, c := range l.comps {
		l.provisioned++
		if p, ok := c.(Provisioner); ok {
			if err := p.Provision(ctx, rt); err != nil {
				return l.fail(fmt.Errorf("%s: %w", c.Name(), err))
			}
		}
	}
	for _, c := range l.comps {
		if v, ok := c.(Validator); ok {
			if err := v.Validate(); err != nil {
				return l.fail(fmt.Errorf("%s: %w", c.Name(), err))
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
