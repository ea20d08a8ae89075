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
	mu       sync.Mutex
	rev      int64
	insts    map[string]map[string]*memLease // service -> id -> owner
	watchers map[*memWatcher]struct{}
	closed   bool
}

// NewMemory returns an empty in-memory registry.
func NewMemory() *Memory {
	return &Memory{insts: map[string]map[string]*memLease{}, watchers: map[*memWatcher]struct{}{}}
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
	l := &memLease{m: m, done: make(chan struct{})}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	l.inst = inst
	svc := m.insts[inst.Service]
	if svc == nil {
		svc = map[string]*memLease{}
		m.insts[inst.Service] = svc
	}
	svc[inst.ID] = l
	m.publish(Event{Type: EventPut, Instance: inst})
	return l, nil
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
		for _, l := range ids {
			first.Events = append(first.Events, Event{Type: EventPut, Instance: l.inst.Clone(), Revision: m.rev})
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
	for w := range m.watchers {
		w.closeLocked()
	}
	return nil
}

type memLease struct {
	m      *Memory
	inst   Instance // guarded by m.mu
	done   chan struct{}
	err    error // guarded by m.mu
	closed bool  // guarded by m.mu
}

func (l *memLease) Instance() Instance {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	return l.inst.Clone()
}

func (l *memLease) Update(ctx context.Context, inst Instance) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	if l.closed || l.m.closed {
		return ErrClosed
	}
	inst, err := CheckUpdate(l.inst, inst)
	if err != nil {
		return err
	}
	l.inst = inst
	if l.m.insts[inst.Service][inst.ID] == l {
		l.m.publish(Event{Type: EventPut, Instance: inst.Clone()})
	}
	return nil
}

func (l *memLease) Done() <-chan struct{} { return l.done }

func (l *memLease) Err() error {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	return l.err
}

func (l *memLease) Close() error {
	m := l.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	l.err = ErrClosed
	close(l.done)
	svc := m.insts[l.inst.Service]
	if svc[l.inst.ID] == l {
		delete(svc, l.inst.ID)
		if len(svc) == 0 {
			delete(m.insts, l.inst.Service)
		}
		if !m.closed {
			m.publish(Event{Type: EventDelete, Instance: Instance{ID: l.inst.ID, Service: l.inst.Service}})
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
