package kubestore

import (
	"context"

	"github.com/lanesdev/lanes/registry"
)

// watcher is one Watch: the view queues its batches, Next takes them.
type watcher struct {
	v       *view
	service string
	wake    chan struct{}    // capacity 1: a pending signal
	pending []registry.Batch // guarded by v.mu
	closed  bool             // guarded by v.mu
}

// Watch implements registry.Registry: the first batch lists the instances
// the Store's informers show now; the later ones are every change after
// it, as the informers see the objects change.
func (s *Store) Watch(ctx context.Context, service string) (registry.Watcher, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	v := s.view
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return nil, registry.ErrClosed
	}
	w := &watcher{v: v, service: service, wake: make(chan struct{}, 1)}
	first := registry.Batch{Reset: true, Revision: v.rev}
	for svc, insts := range v.insts {
		if service != "" && svc != service {
			continue
		}
		for _, sh := range insts {
			first.Events = append(first.Events, registry.Event{Type: registry.EventPut, Instance: sh.inst.Clone(), Revision: v.rev})
		}
	}
	w.pending = []registry.Batch{first}
	w.wake <- struct{}{}
	v.watchers[w] = struct{}{}
	return w, nil
}

// push queues evs as one batch, or adds them to the last one waiting;
// v.mu must be held.
func (w *watcher) push(evs []registry.Event) {
	cl := make([]registry.Event, len(evs))
	for i, ev := range evs {
		ev.Instance = ev.Instance.Clone()
		cl[i] = ev
	}
	rev := cl[len(cl)-1].Revision
	if n := len(w.pending); n > 0 && !w.pending[n-1].Reset {
		w.pending[n-1].Events = append(w.pending[n-1].Events, cl...)
		w.pending[n-1].Revision = rev
	} else {
		w.pending = append(w.pending, registry.Batch{Events: cl, Revision: rev})
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *watcher) Next(ctx context.Context) (registry.Batch, error) {
	for {
		w.v.mu.Lock()
		if w.closed {
			w.v.mu.Unlock()
			return registry.Batch{}, registry.ErrClosed
		}
		if len(w.pending) > 0 {
			b := w.pending[0]
			w.pending = w.pending[1:]
			w.v.mu.Unlock()
			return b, nil
		}
		w.v.mu.Unlock()
		select {
		case <-ctx.Done():
			return registry.Batch{}, ctx.Err()
		case <-w.wake:
		}
	}
}

func (w *watcher) Close() error {
	w.v.mu.Lock()
	defer w.v.mu.Unlock()
	w.closeLocked()
	return nil
}

func (w *watcher) closeLocked() {
	if w.closed {
		return
	}
	w.closed = true
	w.pending = nil
	delete(w.v.watchers, w)
	select {
	case w.wake <- struct{}{}:
	default:
	}
}
