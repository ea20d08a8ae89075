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

// Coalescing of instance changes. A snapshot rebuild costs time in the
// number of instances (milliseconds at 10,000), and a large service under
// churn changes many times a second. So after a rebuild that took d, the
// watcher publishes the next change no sooner than calmFactor*d later (at
// most maxCalm): rebuilds then take at most 1/(calmFactor+1), 1.25%, of the
// watcher's time whatever the churn (and about as much again for the
// garbage collector to reclaim what they allocated). Changes that arrive
// meanwhile are applied together at the end of that wait; a change after a
// quiet period is published at once. The staleness is bounded by
// calmFactor*d and by maxCalm: under a millisecond for small services,
// 0.3 s for one whose rebuild takes 4 ms, 1 s at most.
//
// d is wall time, so a starved machine coalesces more. But one rebuild's
// wall time also counts the time its goroutine was not running (preempted,
// or helping the garbage collector): on a busy process a 10 µs rebuild can
// last 20 ms, and would hold the next change back for most of a second. So d
// is the rebuild's wall time capped at twice the last d (firstCost before
// the first rebuild): an outlier counts for little, while a rebuild that
// really got dearer (a service that grew, a machine that stays starved) is
// followed, d doubling at each rebuild. The first list of a service of
// 10,000 instances is thus followed by a dozen rebuilds without calm, about
// 60 ms in all, before d has caught up.
const (
	calmFactor = 79
	maxCalm    = time.Second
	firstCost  = 50 * time.Microsecond
)

// instanceStream applies a registry watch of one service to the service's
// serviceWatch, which outlives it.
type instanceStream struct {
	w  registry.Watcher
	sw *serviceWatch
	// With a registry.Pusher, the batches are applied, and published when
	// the calm allows, in the watcher's goroutine (onBatch), and next
	// only waits for the end of a calm or of a grace.
	done <-chan struct{} // the Pusher's; nil for a plain Watcher
}

// newInstanceStream starts the stream of w.
func newInstanceStream(w registry.Watcher, sw *serviceWatch) *instanceStream {
	s := &instanceStream{w: w, sw: sw}
	if p, ok := w.(registry.Pusher); ok {
		s.done = p.Push(s.onBatch)
	}
	return s
}

// onBatch applies b, in the Pusher's goroutine.
func (s *instanceStream) onBatch(b registry.Batch) {
	sw := s.sw
	sw.mu.Lock()
	now := time.Now()
	sw.apply(b, now)
	sw.dirty = true
	if !now.Before(sw.calm) {
		sw.publish()
	} else {
		sw.poke()
	}
	sw.mu.Unlock()
}

// nextPushed is next with a Pusher: it publishes at the end of a calm
// that held changes back, and removes held instances at the end of their
// grace.
func (s *instanceStream) nextPushed(ctx context.Context) error {
	sw := s.sw
	var end <-chan time.Time
	sw.mu.Lock()
	now := time.Now()
	if d := sw.deadline(now); !d.IsZero() {
		wait := d.Sub(now)
		if sw.dirty && wait <= 0 {
			sw.publish()
			sw.mu.Unlock()
			return nil
		}
		t := time.NewTimer(wait)
		defer t.Stop()
		end = t.C
	}
	sw.mu.Unlock()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		return registry.ErrClosed
	case <-sw.kick:
	case <-end:
	}
	return nil
}

func (s *instanceStream) next(ctx context.Context) error {
	if s.done != nil {
		return s.nextPushed(ctx)
	}
	sw := s.sw
	sw.mu.Lock()
	now := time.Now()
	d := sw.deadline(now)
	if sw.dirty && !d.After(now) {
		sw.publish()
		sw.mu.Unlock()
		return nil
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if !d.IsZero() {
		var stop context.CancelFunc
		wctx, stop = context.WithDeadline(wctx, d)
		defer stop()
	}
	sw.wake = cancel
	sw.mu.Unlock()
	b, err := s.w.Next(wctx)
	sw.mu.Lock()
	sw.wake = nil
	if err != nil {
		sw.mu.Unlock()
		if ctx.Err() == nil && wctx.Err() != nil {
			return nil // a deadline, or a wake-up (the watch stays usable)
		}
		return err
	}
	now = time.Now()
	sw.apply(b, now)
	sw.dirty = true
	if !now.Before(sw.calm) {
		sw.publish()
	}
	sw.mu.Unlock()
	return nil
}

// rebuildCost is the d of a rebuild that took took, after one whose d was
// last (0 for none: firstCost): took, capped at twice last.
func rebuildCost(took, last time.Duration) time.Duration {
	if last <= 0 {
		last = firstCost
	}
	return min(took, 2*last)
}

func (s *instanceStream) close() { s.w.Close() }

// watchInstances is the follower of one service's instances in reg.
func watchInstances(reg registry.Registry, log *slog.Logger, svc *Service) *follower {
	sw := newServiceWatch(svc)
	return &follower{what: "service " + svc.name, log: log, open: func(ctx context.Context) (stream, error) {
		w, err := reg.Watch(ctx, svc.name)
		if err != nil {
			return nil, err
		}
		return newInstanceStream(w, sw), nil
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
