package registry

// This file holds what a registry backend is made of, and nothing that a user of a registry
// needs: a backend's leases are KeptLease, driven by the backend's Keeper; its watchers may be
// Pushers; a backend that can tell when it last could not reach its store implements Outages
// with an OutageClock. See "Writing a backend" in the package documentation.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lanesdev/lanes/internal/lib/backoff"
)

// Pusher is a Watcher that can hand its batches to a function instead,
// called in the watcher's own goroutine. A consumer that only takes each
// batch and acts on it saves the hand-off between goroutines that Next
// costs: one wake-up and two channel operations per batch, which a process
// of a thousand watchers pays a thousand times at every change. A backend
// implements it when its watcher has a goroutine of its own.
type Pusher interface {
	Watcher
	// Push has fn called with every batch that Next would return from
	// now on, in order and one at a time, in the watcher's goroutine,
	// until the watcher is closed or its backend is; it returns a channel
	// that is closed then, after the last call. fn must not block for
	// long, nor call the watcher (Close waits for the call in progress).
	// Call Push once, before any Next, and Next no more after it.
	Push(fn func(Batch)) (done <-chan struct{})
}

// Outages is implemented by a Registry that can tell when it last could not
// reach its store (or was just back from not reaching it). A routing engine
// watching such a registry holds the instances deleted shortly after an
// outage, which are the leases the store expired because it could not be
// reached, not deregistrations (see routing.WithExpiryGrace).
type Outages interface {
	// LastOutage returns when the backend last found its store
	// unreachable, or found it back; zero if never.
	LastOutage() time.Time
}

// OutageClock records the last outage of a backend, for Outages. The zero
// value is ready to use; it is safe for concurrent use.
type OutageClock struct{ last atomic.Int64 }

// Mark records an outage (or the end of one) at t, unless a later one is
// recorded.
func (c *OutageClock) Mark(t time.Time) {
	n := t.UnixNano()
	for {
		old := c.last.Load()
		if old >= n || c.last.CompareAndSwap(old, n) {
			return
		}
	}
}

// Last returns the time of the last outage recorded; zero if none.
func (c *OutageClock) Last() time.Time {
	n := c.last.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// ErrTakenOver is returned by Keeper.Restore when another registration holds
// the instance by now: a lease does not overwrite a newer registration of
// its ID.
var ErrTakenOver = errors.New("registry: registered again by another registration")

// ErrGone is wrapped by the error of Keeper.Keep when the registry answered
// that the registration is gone (its lease expired): the registry is
// reachable, so KeptLease makes the registration again at once, without the
// backoff that paces its retries against a registry that does not answer.
var ErrGone = errors.New("registry: registration gone")

// A Keeper is the backend side of one registration: how to renew it, make
// it again, rewrite it and end it. KeptLease drives a Keeper and is the
// Lease that callers see, so that every backend's leases behave alike.
//
// KeptLease never calls Restore, Put and Release at the same time.
type Keeper interface {
	// Keep renews the registration until it is lost or ctx is done. It
	// returns when the registration is lost: with an error that wraps
	// ErrLeaseLost when it can never be made again (the lease ends with
	// that error), otherwise with nil or the reason (the lease makes the
	// registration again with Restore: at once when the reason wraps
	// ErrGone).
	Keep(ctx context.Context) error
	// Restore makes the registration of inst again after Keep lost it. It
	// returns ErrTakenOver when another registration holds the instance
	// (the lease then leaves it and stops renewing), an error wrapping
	// ErrLeaseLost when it can never succeed; other errors are retried
	// with backoff.
	Restore(ctx context.Context, inst Instance) error
	// Put writes inst under the registration, only if the registration
	// still holds the instance (else it changes nothing and returns nil).
	Put(ctx context.Context, inst Instance) error
	// Release ends the registration, which removes the instance if the
	// registration still holds it.
	Release(ctx context.Context) error
}

// minGoneKeep is how long Keep must have run for KeptLease to make a
// registration found gone again at once: a Keeper renews a lease after a
// third of its TTL (a second at least) first, so only one that fails at
// once runs for less.
const minGoneKeep = 100 * time.Millisecond

// ReleaseTimeout bounds the Release of KeptLease.Close.
const ReleaseTimeout = 5 * time.Second

// KeptLease is a Lease kept alive by a Keeper: the one lease state machine
// that the registry backends share. It holds the instance as last given,
// serialises Update and Restore, ends once (Done, Err), and on Close stops
// renewing, then releases the registration.
//
// Start runs the renewing loop in a goroutine that the backend owns (a
// backend whose registrations cannot be lost, such as Memory, does not
// start it).
type KeptLease struct {
	k      Keeper
	log    *slog.Logger
	parent context.Context // the backend's: cancelled when it closes
	ctx    context.Context // cancelled by Close and with parent
	cancel context.CancelFunc
	sem    chan struct{} // held while writing: Update and Restore

	running  atomic.Bool
	loopDone chan struct{} // closed when the loop returns

	mu        sync.Mutex
	inst      Instance
	err       error
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

var _ Lease = (*KeptLease)(nil)

// NewKeptLease returns the lease of inst (normalised, as registered) kept by
// k. parent is the backend's context: once it is cancelled the lease can no
// longer change anything, and Close does not release (the backend has
// closed). log receives the renewing loop's troubles (slog.Default when
// nil).
func NewKeptLease(parent context.Context, inst Instance, k Keeper, log *slog.Logger) *KeptLease {
	if log == nil {
		log = slog.Default()
	}
	l := &KeptLease{k: k, log: log, parent: parent, inst: inst, sem: make(chan struct{}, 1),
		loopDone: make(chan struct{}), done: make(chan struct{})}
	l.ctx, l.cancel = context.WithCancel(parent)
	return l
}

// Keeper returns the lease's Keeper.
func (l *KeptLease) Keeper() Keeper { return l.k }

// Instance implements Lease.
func (l *KeptLease) Instance() Instance {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inst.Clone()
}

// Done implements Lease.
func (l *KeptLease) Done() <-chan struct{} { return l.done }

// Err implements Lease.
func (l *KeptLease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// finish ends the lease with err, once.
func (l *KeptLease) finish(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = err
		close(l.done)
	}
}

func (l *KeptLease) acquire(ctx context.Context) error {
	select {
	case l.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-l.ctx.Done():
		return ErrClosed
	}
}

func (l *KeptLease) release() { <-l.sem }

// Update implements Lease: it checks inst with CheckUpdate, then has the
// Keeper put it under the registration.
func (l *KeptLease) Update(ctx context.Context, inst Instance) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	inst, err := CheckUpdate(l.Instance(), inst)
	if err != nil {
		return err
	}
	if l.Err() != nil || l.ctx.Err() != nil {
		return ErrClosed
	}
	if err := l.acquire(ctx); err != nil {
		return err
	}
	defer l.release()
	if err := l.k.Put(ctx, inst); err != nil {
		return err
	}
	l.mu.Lock()
	l.inst = inst
	l.mu.Unlock()
	return nil
}

// Close implements Lease: it stops the renewing loop and waits for it, then
// releases the registration (unless the backend has closed, or the lease
// was lost for good). The release is bounded by ReleaseTimeout; its error is
// returned.
func (l *KeptLease) Close() error {
	l.closeOnce.Do(func() {
		l.cancel()
		if l.running.Load() {
			<-l.loopDone
		}
		if l.parent.Err() == nil && l.Err() == nil {
			ctx, cancel := context.WithTimeout(context.Background(), ReleaseTimeout)
			err := l.k.Release(ctx)
			cancel()
			if err != nil {
				inst := l.Instance()
				l.closeErr = fmt.Errorf("deregister %s/%s: %w (the registration expires within its TTL)", inst.Service, inst.ID, err)
			}
		}
		l.finish(ErrClosed)
	})
	return l.closeErr
}

// Leave stops renewing the registration without releasing it: it stays
// registered until its TTL runs out, or until another registration of the
// same instance takes it over, which then finds it in place. A process that
// hands its registrations to another (lanes up's mirror, when another
// replica takes over) leaves them, so that the instances never disappear
// meanwhile. In a registry whose registrations do not expire (Memory) it
// stays until the registry closes. The lease ends (ErrClosed); Close after
// Leave does nothing.
func (l *KeptLease) Leave() {
	l.closeOnce.Do(func() {
		l.cancel()
		if l.running.Load() {
			<-l.loopDone
		}
		l.finish(ErrClosed)
	})
}

// Start starts the renewing loop with spawn, which runs a function in a
// goroutine of the backend (gogroup.Group.Go, for instance) or returns false
// when the backend is closed. Call it once, before handing out the lease;
// it returns what spawn returned.
//
// The loop renews the registration with Keeper.Keep until Close, makes it
// again with Keeper.Restore whenever it is lost (at once when the registry
// said it is gone, else with backoff from 100ms to 2s, and so are failed
// Restores retried), and ends the lease when the Keeper says it can never
// be kept.
func (l *KeptLease) Start(spawn func(func()) bool) bool {
	l.running.Store(true)
	if !spawn(l.run) {
		l.running.Store(false)
		return false
	}
	return true
}

func (l *KeptLease) run() {
	defer close(l.loopDone)
	defer func() {
		if l.parent.Err() != nil {
			l.finish(ErrClosed)
		}
	}()
	bo := backoff.New(100*time.Millisecond, 2*time.Second)
	for {
		start := time.Now()
		err := l.k.Keep(l.ctx)
		if l.ctx.Err() != nil {
			return
		}
		inst := l.Instance()
		if errors.Is(err, ErrLeaseLost) {
			l.log.Error("registration refused; giving up", "service", inst.Service, "id", inst.ID, "err", err)
			l.finish(err)
			return
		}
		l.log.Warn("registration lost; registering again", "service", inst.Service, "id", inst.ID, "err", err)
		lost := time.Now()
		ran := time.Since(start)
		switch {
		case ran > 5*time.Second:
			bo.Reset()
		case errors.Is(err, ErrGone) && ran >= minGoneKeep:
			// The registry answers: no reason to wait. (The backoff
			// goes on, should the registration be lost at once again.)
		case !bo.Wait(l.ctx): // do not spin if renewals keep failing at once
			return
		}
		for {
			err := l.restore()
			if l.ctx.Err() != nil {
				return
			}
			if err == nil {
				after := time.Since(lost)
				l.log.Info(fmt.Sprintf("registered again after %.1fs", after.Seconds()), "service", inst.Service, "id", inst.ID, "after", after.Round(time.Millisecond).String())
				break
			}
			if errors.Is(err, ErrTakenOver) {
				l.log.Info("instance was registered again by another registration meanwhile; leaving it", "service", inst.Service, "id", inst.ID)
				<-l.ctx.Done()
				return
			}
			if errors.Is(err, ErrLeaseLost) {
				l.log.Error("registration refused; giving up", "service", inst.Service, "id", inst.ID, "err", err)
				l.finish(err)
				return
			}
			l.log.Error("could not register again; retrying", "service", inst.Service, "id", inst.ID, "err", err)
			if !bo.Wait(l.ctx) {
				return
			}
		}
	}
}

func (l *KeptLease) restore() error {
	if err := l.acquire(l.ctx); err != nil {
		return err
	}
	defer l.release()
	return l.k.Restore(l.ctx, l.Instance())
}
