package routing

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

const retryDelay = 500 * time.Millisecond

// stream is one open watch: next blocks for the next change and applies it.
type stream interface {
	next(ctx context.Context) error
	close()
}

// follower keeps something in step with a watched source: it opens a watch,
// applies every change it delivers, and opens it again after an error, until
// its context ends. The registry watcher of each service and the policy
// follower of the engine are followers; the engine owns their goroutines.
type follower struct {
	what string // for logs: "service orders", "policy"
	log  *slog.Logger
	open func(ctx context.Context) (stream, error)
}

func (f *follower) run(ctx context.Context) {
	for ctx.Err() == nil {
		st, err := f.open(ctx)
		if err != nil {
			if ctx.Err() == nil {
				f.log.Warn("lanes: watch failed; retrying", "watch", f.what, "err", err)
				sleep(ctx, retryDelay)
			}
			continue
		}
		for {
			if err := st.next(ctx); err != nil {
				if ctx.Err() == nil && !errors.Is(err, registry.ErrClosed) {
					f.log.Warn("lanes: watch ended; re-watching", "watch", f.what, "err", err)
				}
				break
			}
		}
		st.close()
		sleep(ctx, retryDelay)
	}
}

// instanceStream applies a registry watch of one service to its Service.
type instanceStream struct {
	w   registry.Watcher
	st  registry.State
	svc *Service
}

func (s *instanceStream) next(ctx context.Context) error {
	b, err := s.w.Next(ctx)
	if err != nil {
		return err
	}
	s.st.Apply(b)
	s.svc.setInstances(s.st.Instances(s.svc.name))
	s.svc.markReady()
	return nil
}

func (s *instanceStream) close() { s.w.Close() }

// watchInstances is the follower of one service's instances in reg.
func watchInstances(reg registry.Registry, log *slog.Logger, svc *Service) *follower {
	return &follower{what: "service " + svc.name, log: log, open: func(ctx context.Context) (stream, error) {
		w, err := reg.Watch(ctx, svc.name)
		if err != nil {
			return nil, err
		}
		return &instanceStream{w: w, svc: svc}, nil
	}}
}

// policyStream applies a policy watch to the engine.
type policyStream struct {
	w policy.Watcher
	e *Engine
}

func (s *policyStream) next(ctx context.Context) error {
	doc, err := s.w.Next(ctx)
	if err != nil {
		return err
	}
	s.e.SetPolicy(doc.Policy)
	s.e.policyOnce.Do(func() { close(s.e.policyReady) })
	s.e.log.Debug("lanes: policy in force", "revision", doc.Revision)
	return nil
}

func (s *policyStream) close() { s.w.Close() }

// followPolicy is the follower of the policy in force in st.
func followPolicy(st policy.Store, log *slog.Logger, e *Engine) *follower {
	return &follower{what: "policy", log: log, open: func(ctx context.Context) (stream, error) {
		w, err := st.Watch(ctx)
		if err != nil {
			return nil, err
		}
		return &policyStream{w: w, e: e}, nil
	}}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
