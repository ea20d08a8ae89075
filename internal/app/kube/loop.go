package kube

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/apimachinery/pkg/watch"

	"github.com/lanesdev/lanes/internal/lib/backoff"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/routing"
)

// resync is how often the controllers reconcile with no event to make
// them: a safety net under the watches.
const resync = 30 * time.Second

// callTimeout bounds each call to the API server and etcd.
const callTimeout = 15 * time.Second

// waker is a controller's doorbell: any number of rings before it looks
// make one pass.
type waker chan struct{}

func newWaker() waker { return make(waker, 1) }

func (w waker) wake() {
	select {
	case w <- struct{}{}:
	default:
	}
}

// loop runs reconcile at once, then again on each wake, at the time it
// returns (when not zero), after a failure (backing off), and every
// resync, until ctx ends. Each pass is level-based: it reads the whole
// state, so that passes coalesce and a missed event costs nothing.
func loop(ctx context.Context, log *slog.Logger, what string, w waker, now func() time.Time, reconcile func(context.Context) (time.Time, error)) {
	bo := backoff.New(100*time.Millisecond, 10*time.Second)
	for {
		next, err := reconcile(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn(what+" failed; trying again", "err", err)
			if !bo.Wait(ctx) {
				return
			}
			continue
		}
		bo.Reset()
		wait := resync
		if !next.IsZero() {
			wait = min(wait, max(next.Sub(now()), 0)+10*time.Millisecond)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-w:
		case <-t.C:
		}
		t.Stop()
	}
}

// followKube rings w on every event of the watches that open makes, and
// opens another when one ends, until ctx ends.
func followKube(ctx context.Context, log *slog.Logger, what string, w waker, open func(context.Context) (watch.Interface, error)) {
	bo := backoff.New(100*time.Millisecond, 10*time.Second)
	for ctx.Err() == nil {
		wi, err := open(ctx)
		if err == nil {
			w.wake() // what changed while no watch ran
			for ev := range wi.ResultChan() {
				if ev.Type == watch.Error {
					break
				}
				bo.Reset()
				w.wake()
			}
			wi.Stop()
		} else if ctx.Err() == nil {
			log.Warn("watch "+what, "err", err)
		}
		if !bo.Wait(ctx) {
			return
		}
	}
}

// followEngine rings w each time the engine puts a policy in force.
func followEngine(ctx context.Context, e *routing.Engine, w waker) {
	ch := e.PolicyChanged()
	for {
		select {
		case <-ch:
			// The next channel first: a pass that this wake makes reads
			// a policy at least as new as any it missed.
			ch = e.PolicyChanged()
			w.wake()
		case <-ctx.Done():
			return
		}
	}
}

// followPolicy rings w on every change of the policy in the store.
func followPolicy(ctx context.Context, st policy.Store, w waker) {
	bo := backoff.New(100*time.Millisecond, 10*time.Second)
	for ctx.Err() == nil {
		pw, err := st.Watch(ctx)
		if err == nil {
			for {
				if _, err := pw.Next(ctx); err != nil {
					break
				}
				bo.Reset()
				w.wake()
			}
			pw.Close()
		}
		if !bo.Wait(ctx) {
			return
		}
	}
}
