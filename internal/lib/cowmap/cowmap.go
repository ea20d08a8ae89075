// Package cowmap is the copy-on-write map, written once: readers load it without a lock and
// without allocating; a writer copies it under a lock, changes the copy and publishes it whole.
// It is for tables read on every request and changed rarely: the routing engine's services, the
// encoded lanes, the gRPC picker's lane metadata, the admin API's client-IP claims.
//
// A Map's writes are serialised by its own lock, held only while the map is copied. A caller
// that must keep its own state in step with the map (the routing engine creates a service under
// the lock that also guards its policy) takes its own lock around the write: the Map's lock is
// always the inner one.
package cowmap

import (
	"iter"
	"sync"
	"sync/atomic"
)

// Map is a copy-on-write map from K to V. The zero Map is empty and ready to use. A Map must not
// be copied after first use. The values it holds are shared by every reader: store values that
// are immutable, or safe for concurrent use.
type Map[K comparable, V any] struct {
	mu sync.Mutex
	p  atomic.Pointer[map[K]V]
}

// Load returns the value of k, and whether the map holds one. It takes no lock and does not
// allocate.
func (m *Map[K, V]) Load(k K) (V, bool) {
	if p := m.p.Load(); p != nil {
		v, ok := (*p)[k]
		return v, ok
	}
	var zero V
	return zero, false
}

// Len returns the number of entries.
func (m *Map[K, V]) Len() int {
	if p := m.p.Load(); p != nil {
		return len(*p)
	}
	return 0
}

// All returns the entries of the map as it is now, in no order: a later write does not change
// what an iteration sees.
func (m *Map[K, V]) All() iter.Seq2[K, V] {
	p := m.p.Load()
	return func(yield func(K, V) bool) {
		if p == nil {
			return
		}
		for k, v := range *p {
			if !yield(k, v) {
				return
			}
		}
	}
}

// LoadOrStore returns the value of k. When the map holds none, it calls create, under the
// Map's lock, and stores the value made unless the map already holds bound entries (bound <= 0: no
// bound); stored reports that the value returned was made and stored by this call. A value made
// but not stored, past the bound, is returned all the same: a cache bounded so that names read
// from requests cannot grow it for ever still answers them.
func (m *Map[K, V]) LoadOrStore(k K, create func() V, bound int) (v V, stored bool) {
	if v, ok := m.Load(k); ok {
		return v, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.p.Load()
	if old != nil {
		if v, ok := (*old)[k]; ok {
			return v, false
		}
	}
	v = create()
	n := 0
	if old != nil {
		n = len(*old)
	}
	if bound > 0 && n >= bound {
		return v, false
	}
	next := make(map[K]V, n+1)
	if old != nil {
		for k, v := range *old {
			next[k] = v
		}
	}
	next[k] = v
	m.p.Store(&next)
	return v, true
}

// Update publishes a copy of the map that change has modified: it may add, replace and delete
// entries. change runs under the Map's lock and must not call the Map.
func (m *Map[K, V]) Update(change func(next map[K]V)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var next map[K]V
	if old := m.p.Load(); old != nil {
		next = make(map[K]V, len(*old)+1)
		for k, v := range *old {
			next[k] = v
		}
	} else {
		next = map[K]V{}
	}
	change(next)
	m.p.Store(&next)
}

// Replace publishes next as the whole map. The Map owns next from then on: the caller must not
// modify it.
func (m *Map[K, V]) Replace(next map[K]V) {
	if next == nil {
		next = map[K]V{}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.p.Store(&next)
}
