package registry

import (
	"context"
	"sync"
	"time"
)

// Memory is an in-process Registry. It keeps instances in a map and delivers
// every change to every watcher in order. Its leases never expire on their
// own (there is no other process to outlive); Close deregisters.
//
// Memory is for unit tests and single-process use. Its zero value is not
// usable; call NewMemory.
type Memory struct {
	ctx    context.Context // cancelled by Close: leases can no longer change anything
	cancel context.CancelFunc

	mu       sync.Mutex
	rev      int64
	insts    map[string]map[string]*memKeeper // service -> id -> holder
	watchers map[*memWatcher]struct{}
	closed   bool
}

// NewMemory returns an empty in-memory registry.
func NewMemory() *Memory {
	m := &Memory{insts: map[string]map[string]*memKeeper{}, watchers: map[*memWatcher]struct{}{}}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	return m
}

var _ Registry = (*Memory)(nil)

// Register implements Registry. The ttl is validated but not enforced.
func (m *Memory) Register(ctx context.Context, inst Instance, ttl time.Duration) (Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if ttl < 0 {
		return nil, &FieldError{Field: "ttl", Value: ttl.String(), Msg: "must not be negative"}
	}
	inst, err := Normalize(inst)
	if err != nil {
		return nil, err
	}
	k := &memKeeper{m: m, inst: inst}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	svc := m.insts[inst.Service]
	if svc == nil {
		svc = map[string]*memKeeper{}
		m.insts[inst.Service] = svc
	}
	svc[inst.ID] = k
	m.publish(Event{Type: EventPut, Instance: inst})
	// A memory registration cannot be lost: the lease's loop is not run.
	return NewKeptLease(m.ctx, inst, k, nil), nil
}

// publish stamps ev with the next revision and queues it for every watcher
// of its service. m.mu must be held.
func (m *Memory) publish(ev Event) {
	m.rev++
	ev.Revision = m.rev
	for w := range m.watchers {
		if w.service == "" || w.service == ev.Instance.Service {
			w.push(ev)
		}
	}
}

// Watch implements Registry.
func (m *Memory) Watch(ctx context.Context, service string) (Watcher, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	w := &memWatcher{m: m, service: service, wake: make(chan struct{}, 1)}
	first := Batch{Reset: true, Revision: m.rev}
	for svc, ids := range m.insts {
		if service != "" && svc != service {
			continue
		}
		for _, k := range ids {
			first.Events = append(first.Events, Event{Type: EventPut, Instance: k.inst.Clone(), Revision: m.rev})
		}
	}
	w.pending = []Batch{first}
	w.wake <- struct{}{}
	m.watchers[w] = struct{}{}
	return w, nil
}

// Close implements Registry: it ends every watcher. Leases stay registered
// but can no longer change anything.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	m.cancel()
	for w := range m.watchers {
		w.closeLocked()
	}
	return nil
}

// memKeeper is the Keeper of one memory registration.
type memKeeper struct {
	m    *Memory
	inst Instance // guarded by m.mu
}

// Keep implements Keeper: a memory registration is never lost.
func (k *memKeeper) Keep(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

// Restore implements Keeper; it is never called.
func (k *memKeeper) Restore(context.Context, Instance) error { return nil }

// Put implements Keeper.
func (k *memKeeper) Put(_ context.Context, inst Instance) error {
	m := k.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	k.inst = inst
	if m.insts[inst.Service][inst.ID] == k {
		m.publish(Event{Type: EventPut, Instance: inst.Clone()})
	}
	return nil
}

// Release implements Keeper.
func (k *memKeeper) Release(context.Context) error {
	m := k.m
	m.mu.Lock()
	defer m.mu.Unlock()
	svc := m.insts[k.inst.Service]
	if svc[k.inst.ID] == k {
		delete(svc, k.inst.ID)
		if len(svc) == 0 {
			delete(m.insts, k.inst.Service)
		}
		if !m.closed {
			m.publish(Event{Type: EventDelete, Instance: Instance{ID: k.inst.ID, Service: k.inst.Service}})
		}
	}
	return nil
}

type memWatcher struct {
	m       *Memory
	service string
	wake    chan struct{} // capacity 1: a pending signal
	pending []Batch       // guarded by m.mu
	closed  bool          // guarded by m.mu
}

// push queues ev; m.mu must be held.
func (w *memWatcher) push(ev Event) {
	ev.Instance = ev.Instance.Clone()
	if n := len(w.pending); n > 0 && !w.pending[n-1].Reset {
		w.pending[n-1].Events = append(w.pending[n-1].Events, ev)
		w.pending[n-1].Revision = ev.Revision
	} else {
		w.pending = append(w.pending, Batch{Events: []Event{ev}, Revision: ev.Revision})
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *memWatcher) Next(ctx context.Context) (Batch, error) {
	for {
		w.m.mu.Lock()
		if w.closed {
			w.m.mu.Unlock()
			return Batch{}, ErrClosed
		}
		if len(w.pending) > 0 {
			b := w.pending[0]
			w.pending = w.pending[1:]
			w.m.mu.Unlock()
			return b, nil
		}
		w.m.mu.Unlock()
		select {
		case <-ctx.Done():
			return Batch{}, ctx.Err()
		case <-w.wake:
		}
	}
}

func (w *memWatcher) Close() error {
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	w.closeLocked()
	return nil
}

func (w *memWatcher) closeLocked() {
	if w.closed {
		return
	}
	w.closed = true
	w.pending = nil
	delete(w.m.watchers, w)
	select {
	case w.wake <- struct{}{}:
	default:
	}
}
