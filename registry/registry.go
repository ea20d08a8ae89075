// Package registry holds the instance model of lanes and the small interface
// that every registry backend implements: register an instance under a lease,
// and watch a service's instances without missing or reordering a change.
//
// Two backends ship with lanes: an in-memory one (NewMemory), for unit tests
// and single-process use, and an etcd one in package etcdstore, for fleets.
// Union follows several registries as one (lanes up --kube follows its
// etcd and a Kubernetes cluster so).
// A service uses them through Registry, Lease and Watcher alone, usually by
// way of a routing.Engine and a transport's Serve.
//
// # Writing a backend
//
// A backend implements Registry. What it is made of is in one file,
// backend.go, and a user of a registry needs none of it:
//
//   - Keeper is the backend side of one registration (renew it, make it
//     again, put an update, release it); NewKeptLease wraps it in a
//     KeptLease, the one lease state machine that every backend's leases
//     are, so that they all behave alike (ErrGone, ErrTakenOver, and
//     ReleaseTimeout are its terms). CheckUpdate is the rule of every
//     Lease.Update.
//   - Pusher is a Watcher that hands its batches to a function in its own
//     goroutine, for a backend whose watcher has one.
//   - Outages is implemented by a backend that can tell when it last could
//     not reach its store; OutageClock records it.
//
// lanes' own backends (NewMemory, etcdstore, adminclient) pass one
// conformance suite; a backend elsewhere should hold to the contract of
// Registry, Lease and Watcher that the suite checks.
package registry

import (
	"context"
	"errors"
	"time"
)

// DefaultTTL is the lease of a registration that does not choose one.
const DefaultTTL = 10 * time.Second

// Registry is the interface that every backend implements.
//
// Implementations are safe for concurrent use. Their methods take a context
// first; cancelling it abandons the call, not the registration or watch that
// the call created (those end with their own Close).
type Registry interface {
	// Register validates inst with Normalize and publishes it under a lease
	// of the given TTL (DefaultTTL when zero). The backend renews the lease
	// until Lease.Close, which deregisters the instance. When the process
	// dies, the lease expires and the instance disappears within ttl.
	//
	// Registering an ID that another live lease holds in the same service
	// replaces that registration.
	Register(ctx context.Context, inst Instance, ttl time.Duration) (Lease, error)

	// Watch lists the instances of service (of every service when service is
	// empty) and then streams every later change from the revision of that
	// list, so that no change is missed or reordered. See Watcher.
	Watch(ctx context.Context, service string) (Watcher, error)

	// Close releases the backend's resources. It does not deregister leases
	// still open; they expire with their TTL.
	Close() error
}

// Lease keeps one registration alive.
type Lease interface {
	// Instance returns the instance as registered (normalised).
	Instance() Instance
	// Update replaces the registered instance, for example to drain it. The
	// ID and Service cannot change.
	Update(ctx context.Context, inst Instance) error
	// Done is closed when the lease ends: after Close, or when the backend
	// could not renew it and gave up. Err tells which.
	Done() <-chan struct{}
	// Err returns nil while the lease is alive, ErrClosed after Close, or the
	// reason the lease was lost.
	Err() error
	// Close deregisters the instance and stops renewing the lease. It waits
	// for the renewing goroutine to exit. It is safe to call more than once.
	Close() error
}

// EventType says what happened to an instance.
type EventType uint8

const (
	EventPut    EventType = iota + 1 // registered or updated
	EventDelete                      // deregistered or expired
)

func (t EventType) String() string {
	switch t {
	case EventPut:
		return "put"
	case EventDelete:
		return "delete"
	}
	return "unknown"
}

// Event is one change to one instance. For EventDelete only Instance.ID and
// Instance.Service are guaranteed to be set.
type Event struct {
	Type     EventType
	Instance Instance
	Revision int64 // the backend revision of the change; it grows with every change
}

// Batch is what Watcher.Next returns.
//
// When Reset is true, Events lists every instance that exists at Revision as
// EventPut events, and the receiver must replace everything it knew. The first
// batch of a watch is always a reset; a backend also sends one when it had to
// relist (for example after its history was compacted).
//
// When Reset is false, Events are the changes after the previous batch, in the
// order they happened.
type Batch struct {
	Reset    bool
	Events   []Event
	Revision int64
}

// Watcher streams the changes to one watch.
type Watcher interface {
	// Next blocks until the next batch is available or ctx is done. After
	// Close, or once the backend is closed, it returns ErrClosed.
	Next(ctx context.Context) (Batch, error)
	// Close stops the watch and waits for its goroutines to exit.
	Close() error
}

// ErrClosed is returned by calls on a closed lease, watcher or registry.
var ErrClosed = errors.New("registry: closed")

// ErrLeaseLost is returned by Lease.Err when the backend could not keep the
// lease alive and gave up.
var ErrLeaseLost = errors.New("registry: lease lost")

// State applies batches to a map of instances keyed by service and ID. It is
// the usual way to consume a Watcher. The zero value is ready to use; it is
// not safe for concurrent use.
type State struct {
	Services map[string]map[string]Instance
	Revision int64
}

// Apply folds b into s and returns the services whose instances changed.
func (s *State) Apply(b Batch) (changed map[string]bool) {
	changed = map[string]bool{}
	if b.Reset {
		for svc := range s.Services {
			changed[svc] = true
		}
		s.Services = map[string]map[string]Instance{}
	}
	if s.Services == nil {
		s.Services = map[string]map[string]Instance{}
	}
	for _, ev := range b.Events {
		svc := ev.Instance.Service
		changed[svc] = true
		switch ev.Type {
		case EventPut:
			m := s.Services[svc]
			if m == nil {
				m = map[string]Instance{}
				s.Services[svc] = m
			}
			m[ev.Instance.ID] = ev.Instance
		case EventDelete:
			delete(s.Services[svc], ev.Instance.ID)
			if len(s.Services[svc]) == 0 {
				delete(s.Services, svc)
			}
		}
	}
	s.Revision = b.Revision
	return changed
}

// Instances returns the instances of service, in no particular order.
func (s *State) Instances(service string) []Instance {
	out := make([]Instance, 0, len(s.Services[service]))
	for _, in := range s.Services[service] {
		out = append(out, in)
	}
	return out
}
