package routing

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
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

// instanceStream applies a registry watch of one service to its Service.
type instanceStream struct {
	w   registry.Watcher
	svc *Service
	// insts are the service's instances, in id order: the stream's own
	// slice, of instances that are never changed once here (a change puts
	// a new one in), so that a publication copies the pointers only, and
	// the snapshots in force keep the instances they point at.
	insts []*registry.Instance
	dirty bool          // insts has changes that svc does not have yet
	calm  time.Time     // no publication before then
	cost  time.Duration // d of the last rebuild (see calmFactor)

	// With a registry.Pusher, the batches are applied, and published when
	// the calm allows, in the watcher's goroutine (onBatch), and next
	// only waits for the end of a calm: mu then guards the fields above.
	mu   sync.Mutex
	done <-chan struct{} // the Pusher's; nil for a plain Watcher
	kick chan struct{}   // a batch came within a calm; capacity 1
}

// newInstanceStream starts the stream of w.
func newInstanceStream(w registry.Watcher, svc *Service) *instanceStream {
	s := &instanceStream{w: w, svc: svc}
	if p, ok := w.(registry.Pusher); ok {
		s.kick = make(chan struct{}, 1)
		s.done = p.Push(s.onBatch)
	}
	return s
}

// onBatch applies b, in the Pusher's goroutine.
func (s *instanceStream) onBatch(b registry.Batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.apply(b)
	s.dirty = true
	if !time.Now().Before(s.calm) {
		s.publish()
		return
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// nextPushed is next with a Pusher: it publishes at the end of a calm
// that held changes back.
func (s *instanceStream) nextPushed(ctx context.Context) error {
	var end <-chan time.Time
	s.mu.Lock()
	if s.dirty {
		wait := time.Until(s.calm)
		if wait <= 0 {
			s.publish()
			s.mu.Unlock()
			return nil
		}
		t := time.NewTimer(wait)
		defer t.Stop()
		end = t.C
	}
	s.mu.Unlock()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		return registry.ErrClosed
	case <-s.kick:
	case <-end:
	}
	return nil
}

func (s *instanceStream) next(ctx context.Context) error {
	if s.done != nil {
		return s.nextPushed(ctx)
	}
	wctx := ctx
	if s.dirty {
		wait := time.Until(s.calm)
		if wait <= 0 {
			s.publish()
			return nil
		}
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	b, err := s.w.Next(wctx)
	if err != nil {
		if s.dirty && ctx.Err() == nil && wctx.Err() != nil {
			s.publish() // the wait is over (the watch stays usable)
			return nil
		}
		return err
	}
	s.apply(b)
	s.dirty = true
	if !time.Now().Before(s.calm) {
		s.publish()
	}
	return nil
}

// apply folds b into s.insts, keeping them in id order, so that a
// publication copies them rather than sorting them again (a tenth of the
// watcher's time under churn at 10,000 instances).
func (s *instanceStream) apply(b registry.Batch) {
	if b.Reset {
		n := 0
		for _, ev := range b.Events {
			if ev.Type == registry.EventPut && ev.Instance.Service == s.svc.name {
				n++
			}
		}
		all := make([]registry.Instance, 0, n) // one allocation for every instance
		s.insts = s.insts[:0]
		for _, ev := range b.Events {
			if ev.Type == registry.EventPut && ev.Instance.Service == s.svc.name {
				all = append(all, ev.Instance)
				s.insts = append(s.insts, &all[len(all)-1])
			}
		}
		byID(s.insts)
		return
	}
	var fresh []registry.Instance // the batch's new instances, in one allocation
	for _, ev := range b.Events {
		if ev.Instance.Service != s.svc.name {
			continue
		}
		i, found := slices.BinarySearchFunc(s.insts, ev.Instance.ID, func(in *registry.Instance, id string) int { return strings.Compare(in.ID, id) })
		if ev.Type == registry.EventDelete {
			if found {
				s.insts = slices.Delete(s.insts, i, i+1)
			}
			continue
		}
		if fresh == nil {
			fresh = make([]registry.Instance, 0, len(b.Events))
		}
		fresh = append(fresh, ev.Instance)
		if in := &fresh[len(fresh)-1]; found {
			s.insts[i] = in
		} else {
			s.insts = slices.Insert(s.insts, i, in)
		}
	}
}

// publish gives the service a copy of s.insts, and sets the calm after it.
func (s *instanceStream) publish() {
	start := time.Now()
	s.svc.replace(slices.Clone(s.insts))
	s.svc.markReady()
	s.dirty = false
	end := time.Now()
	s.cost = rebuildCost(end.Sub(start), s.cost)
	s.calm = end.Add(min(calmFactor*s.cost, maxCalm))
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
	return &follower{what: "service " + svc.name, log: log, open: func(ctx context.Context) (stream, error) {
		w, err := reg.Watch(ctx, svc.name)
		if err != nil {
			return nil, err
		}
		return newInstanceStream(w, svc), nil
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
