package registry

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Union returns a registry made of several: a watch follows the instances
// of every member as one registry's, and a registration goes to the first
// member, primary. lanes up follows its own etcd and a Kubernetes cluster
// this way: what registers through its admin API is in etcd, the pods are
// in the cluster, and its engine routes to both.
//
// Two members may know the same instance: a pod that registers itself
// through the admin API is also an endpoint of its Service. The earlier
// member in the order given decides: an instance of a later member is left
// out of a watch while an earlier member has an instance of the same
// service with the same ID or the same address. So a pod registered by
// its process in a lane is not also seen as the baseline because its pod
// carries no lane label.
//
// A watch's revisions are the union's own, growing with every change it
// delivers; an event's instance is the member's. A watch whose reader
// falls more than MaxUnionBacklog events behind is sent a reset batch of
// what exists then, instead of the events it missed. The first error of a
// member's watch ends the union's, once what came before it is read.
//
// Close ends the union's watches; the members are the caller's, to close
// after it. The union reports registry.Outages: the latest of its members'.
func Union(primary Registry, more ...Registry) Registry {
	return &union{members: append([]Registry{primary}, more...), watchers: map[*unionWatcher]struct{}{}}
}

// MaxUnionBacklog bounds the events a union's watch keeps for a reader that
// does not read them: past it, they are replaced by a reset batch.
const MaxUnionBacklog = 1 << 14

type union struct {
	members []Registry
	rev     atomic.Int64 // the last revision given, across the union's watches

	mu       sync.Mutex
	closed   bool
	watchers map[*unionWatcher]struct{}
}

func (u *union) Register(ctx context.Context, inst Instance, ttl time.Duration) (Lease, error) {
	if u.isClosed() {
		return nil, ErrClosed
	}
	l, err := u.members[0].Register(ctx, inst, ttl)
	if err != nil {
		return nil, err
	}
	return unionLease{l, u}, nil
}

// unionLease is a lease of the first member, which takes no update once
// the union is closed, as a lease of any closed registry.
type unionLease struct {
	Lease
	u *union
}

func (l unionLease) Update(ctx context.Context, inst Instance) error {
	if l.u.isClosed() {
		return ErrClosed
	}
	return l.Lease.Update(ctx, inst)
}

func (u *union) isClosed() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.closed
}

// LastOutage returns the latest outage of the members that can tell.
func (u *union) LastOutage() time.Time {
	var last time.Time
	for _, m := range u.members {
		if o, ok := m.(Outages); ok {
			if t := o.LastOutage(); t.After(last) {
				last = t
			}
		}
	}
	return last
}

func (u *union) Close() error {
	u.mu.Lock()
	u.closed = true
	ws := make([]*unionWatcher, 0, len(u.watchers))
	for w := range u.watchers {
		ws = append(ws, w)
	}
	u.mu.Unlock()
	for _, w := range ws {
		w.Close()
	}
	return nil
}

func (u *union) Watch(ctx context.Context, service string) (Watcher, error) {
	if service != "" {
		if err := CheckService(service); err != nil {
			return nil, err
		}
	}
	wctx, cancel := context.WithCancel(context.Background())
	w := &unionWatcher{
		u: u, cancel: cancel, wake: make(chan struct{}, 1), reset: true,
		states: make([]State, len(u.members)),
		view:   map[string]map[string]Instance{},
	}
	for _, m := range u.members {
		mw, err := m.Watch(ctx, service)
		if err != nil {
			cancel()
			for _, o := range w.ws {
				o.Close()
			}
			return nil, err
		}
		w.ws = append(w.ws, mw)
	}
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		cancel()
		for _, o := range w.ws {
			o.Close()
		}
		return nil, ErrClosed
	}
	u.watchers[w] = struct{}{}
	u.mu.Unlock()
	w.wg.Add(len(w.ws))
	for i, mw := range w.ws {
		go w.follow(wctx, i, mw) // ends with wctx, which Close cancels, and waits for
	}
	return w, nil
}

// unionWatcher merges its members' watches into one.
type unionWatcher struct {
	u      *union
	ws     []Watcher
	cancel context.CancelFunc
	wg     sync.WaitGroup
	wake   chan struct{} // capacity 1: something for Next

	mu      sync.Mutex
	states  []State                        // by member
	started int                            // members whose first batch came
	view    map[string]map[string]Instance // what the reader has been given (or will be, by the reset)
	queue   []Event                        // the events after view's reset, not read yet
	reset   bool                           // the next batch is a reset of view
	err     error                          // the first member's watch error
	closed  bool
}

// follow applies the batches of member i's watch until it ends.
func (w *unionWatcher) follow(ctx context.Context, i int, mw Watcher) {
	defer w.wg.Done()
	for {
		b, err := mw.Next(ctx)
		w.mu.Lock()
		if err != nil {
			if w.err == nil && ctx.Err() == nil {
				w.err = err
			}
			w.mu.Unlock()
			w.poke()
			return
		}
		w.apply(i, b)
		w.mu.Unlock()
		w.poke()
	}
}

func (w *unionWatcher) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// apply folds member i's batch into its state and queues the changes it
// makes to the union's view. Called with w.mu held.
func (w *unionWatcher) apply(i int, b Batch) {
	st := &w.states[i]
	if first := st.Services == nil; first || b.Reset {
		changed := st.Apply(b) // the first batch is a reset
		if !first {
			w.refresh(changed)
			return
		}
		w.started++
		if w.started == len(w.ws) {
			w.view = w.compute(nil)
		}
		return
	}
	for _, ev := range b.Events {
		// One event at a time, so that the union's events keep the
		// member's order.
		changed := st.Apply(Batch{Events: []Event{ev}, Revision: ev.Revision})
		if w.started == len(w.ws) {
			w.refresh(changed)
		}
	}
}

// compute returns the union's view of services (of all when nil): each
// member's instances, in the members' order, but for those whose ID or
// address an earlier member's instance of the service has.
func (w *unionWatcher) compute(services map[string]bool) map[string]map[string]Instance {
	out := map[string]map[string]Instance{}
	addrs := map[string]int{} // "service\x00addr" → the first member that has it
	for i, st := range w.states {
		for svc, ins := range st.Services {
			if services != nil && !services[svc] {
				continue
			}
			m := out[svc]
			for id, in := range ins {
				if _, taken := m[id]; taken {
					continue
				}
				k := svc + "\x00" + in.Addr
				if j, ok := addrs[k]; ok && j < i {
					continue
				}
				addrs[k] = i
				if m == nil {
					m = map[string]Instance{}
					out[svc] = m
				}
				m[id] = in
			}
		}
	}
	return out
}

// refresh recomputes the view of services and queues its changes as
// events. Called with w.mu held, once every member has started.
func (w *unionWatcher) refresh(services map[string]bool) {
	now := w.compute(services)
	var evs []Event
	for svc := range services {
		old, cur := w.view[svc], now[svc]
		for id := range old {
			if _, ok := cur[id]; !ok {
				evs = append(evs, Event{Type: EventDelete, Instance: Instance{ID: id, Service: svc}})
			}
		}
		for id, in := range cur {
			if was, ok := old[id]; !ok || !was.Equal(in) {
				evs = append(evs, Event{Type: EventPut, Instance: in})
			}
		}
		if len(cur) == 0 {
			delete(w.view, svc)
		} else {
			w.view[svc] = cur
		}
	}
	if w.reset || len(evs) == 0 {
		return // the reset to come lists the view as it is then
	}
	if len(w.queue)+len(evs) > MaxUnionBacklog {
		w.queue, w.reset = nil, true
		return
	}
	for k := range evs {
		evs[k].Revision = w.u.rev.Add(1)
	}
	w.queue = append(w.queue, evs...)
}

func (w *unionWatcher) Next(ctx context.Context) (Batch, error) {
	for {
		w.mu.Lock()
		switch {
		case w.closed:
			w.mu.Unlock()
			return Batch{}, ErrClosed
		case w.started == len(w.ws) && w.reset:
			b := Batch{Reset: true, Revision: w.u.rev.Add(1)}
			for _, ins := range w.view {
				for _, in := range ins {
					b.Events = append(b.Events, Event{Type: EventPut, Instance: in, Revision: b.Revision})
				}
			}
			w.reset, w.queue = false, nil
			w.mu.Unlock()
			return b, nil
		case len(w.queue) > 0:
			b := Batch{Events: w.queue, Revision: w.queue[len(w.queue)-1].Revision}
			w.queue = nil
			w.mu.Unlock()
			return b, nil
		case w.err != nil:
			err := w.err
			w.mu.Unlock()
			if errors.Is(err, context.Canceled) {
				err = ErrClosed
			}
			return Batch{}, err
		}
		w.mu.Unlock()
		select {
		case <-w.wake:
		case <-ctx.Done():
			return Batch{}, ctx.Err()
		}
	}
}

func (w *unionWatcher) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.mu.Unlock()
	w.cancel()
	for _, mw := range w.ws {
		mw.Close()
	}
	w.wg.Wait()
	w.poke()
	w.u.mu.Lock()
	delete(w.u.watchers, w)
	w.u.mu.Unlock()
	return nil
}
