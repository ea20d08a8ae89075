package adminclient

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/registry"
)

// Registry is a registry.Registry over the admin API: registrations are
// etcd leases that the control plane grants, kept alive by heartbeats this
// Registry sends, and watches are streams of batches.
//
// What the token allows decides what Register accepts: a lane token
// registers instances of its lane only, a baseline token baseline instances
// only, and the admin token anything. Any token may watch.
//
// A heartbeat that finds the registration gone (the process was suspended
// for longer than the TTL, or the control plane lost it) registers the
// instance again, unless another registration of the same id has taken its
// place. A registration ends for good — Lease.Done is closed and Lease.Err
// wraps registry.ErrLeaseLost — when the control plane refuses it: its lane
// has expired, or its token was revoked.
type Registry struct {
	c   *Client
	log *slog.Logger

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

var _ registry.Registry = (*Registry)(nil)

// RegistryOption configures a Registry.
type RegistryOption func(*Registry)

// WithLogger sets the logger of heartbeat and watch troubles (default
// slog.Default()).
func WithLogger(l *slog.Logger) RegistryOption { return func(r *Registry) { r.log = l } }

// NewRegistry returns a Registry that registers and watches through c.
// Closing the Registry does not close c.
func NewRegistry(c *Client, opts ...RegistryOption) *Registry {
	r := &Registry{c: c, log: slog.Default()}
	for _, o := range opts {
		o(r)
	}
	r.log = r.log.With("component", "adminclient")
	r.ctx, r.cancel = context.WithCancel(context.Background())
	return r
}

// spawn runs f in a goroutine that Close waits for; false when closed.
func (r *Registry) spawn(f func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		f()
	}()
	return true
}

func (r *Registry) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// Close stops every heartbeat and watch, without deregistering: the
// instances disappear when their TTL runs out. Close the leases first for a
// clean deregistration. It is safe to call more than once.
func (r *Registry) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
	return nil
}

// Register implements registry.Registry. It validates inst locally first,
// so that a bad field is a *registry.FieldError as with every backend; a
// refusal by the control plane (token scope, expired lane, an id held by
// another lane) is an *adminapi.Error.
func (r *Registry) Register(ctx context.Context, inst registry.Instance, ttl time.Duration) (registry.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	switch {
	case ttl < 0:
		return nil, &registry.FieldError{Field: "ttl", Value: ttl.String(), Msg: "must not be negative"}
	case ttl == 0:
		ttl = registry.DefaultTTL
	case ttl < time.Second:
		return nil, &registry.FieldError{Field: "ttl", Value: ttl.String(), Msg: "must be at least 1s (etcd leases count whole seconds)"}
	}
	inst, err := registry.Normalize(inst)
	if err != nil {
		return nil, err
	}
	if r.isClosed() {
		return nil, registry.ErrClosed
	}
	reg, err := r.c.Register(ctx, adminapi.RegisterRequest{Instance: inst, TTL: adminapi.Duration(ttl)})
	if err != nil {
		return nil, err
	}
	l := &lease{r: r, ttl: ttl, inst: reg.Instance, reg: reg.Registration,
		sem: make(chan struct{}, 1), loopDone: make(chan struct{}), done: make(chan struct{})}
	l.ctx, l.cancel = context.WithCancel(r.ctx)
	if !r.spawn(l.heartbeat) {
		l.cancel()
		r.deregister(reg.Instance, reg.Registration)
		return nil, registry.ErrClosed
	}
	return l, nil
}

func (r *Registry) deregister(inst registry.Instance, reg string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := r.c.Deregister(ctx, inst.Service, inst.ID, reg)
	if adminapi.IsCode(err, adminapi.CodeNotFound) {
		err = nil
	}
	return err
}

// lease is a registry.Lease kept alive by heartbeats.
type lease struct {
	r   *Registry
	ttl time.Duration

	ctx      context.Context
	cancel   context.CancelFunc
	sem      chan struct{} // held while writing: Update and re-registration
	loopDone chan struct{}

	mu        sync.Mutex
	inst      registry.Instance
	reg       string
	err       error
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

func (l *lease) Instance() registry.Instance {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inst.Clone()
}

// Registration returns the registration id (the etcd lease, in hex) that
// currently holds the instance. It changes when the instance had to be
// registered again.
func (l *lease) Registration() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reg
}

func (l *lease) Done() <-chan struct{} { return l.done }

func (l *lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *lease) finish(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = err
		close(l.done)
	}
}

func (l *lease) acquire(ctx context.Context) error {
	select {
	case l.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-l.ctx.Done():
		return registry.ErrClosed
	}
}

func (l *lease) release() { <-l.sem }

// Update implements registry.Lease: the instance is put under the same
// registration, only if that registration still holds it.
func (l *lease) Update(ctx context.Context, inst registry.Instance) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	inst, err := registry.CheckUpdate(l.Instance(), inst)
	if err != nil {
		return err
	}
	if l.Err() != nil || l.ctx.Err() != nil {
		return registry.ErrClosed
	}
	if err := l.acquire(ctx); err != nil {
		return err
	}
	defer l.release()
	reg, err := l.r.c.Register(ctx, adminapi.RegisterRequest{Instance: inst, TTL: adminapi.Duration(l.ttl), Registration: l.Registration()})
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.inst = reg.Instance
	l.mu.Unlock()
	return nil
}

// Close implements registry.Lease: it stops the heartbeats and ends the
// registration, which removes the instance (if this registration still
// holds it) and any claim attached to it.
func (l *lease) Close() error {
	l.closeOnce.Do(func() {
		l.cancel()
		<-l.loopDone
		if !l.r.isClosed() && l.Err() == nil {
			if err := l.r.deregister(l.Instance(), l.Registration()); err != nil {
				l.closeErr = fmt.Errorf("adminclient: deregister %s/%s: %w (it expires within its TTL)", l.inst.Service, l.inst.ID, err)
			}
		}
		l.finish(registry.ErrClosed)
	})
	return l.closeErr
}

// heartbeat renews the registration every third of its TTL until the lease
// closes. It is the lease's goroutine.
func (l *lease) heartbeat() {
	defer close(l.loopDone)
	defer func() {
		if l.r.ctx.Err() != nil {
			l.finish(registry.ErrClosed)
		}
	}()
	interval := max(l.ttl/3, 300*time.Millisecond)
	delay := interval
	failDelay := 100 * time.Millisecond
	for {
		if !sleep(l.ctx, delay) {
			return
		}
		inst := l.Instance()
		ctx, cancel := context.WithTimeout(l.ctx, min(timeout, l.ttl))
		_, err := l.r.c.Heartbeat(ctx, inst.Service, inst.ID, l.Registration())
		cancel()
		if l.ctx.Err() != nil {
			return
		}
		switch {
		case err == nil:
			delay, failDelay = interval, 100*time.Millisecond
			continue
		case adminapi.IsCode(err, adminapi.CodeNotFound):
			l.r.log.Warn("registration expired; registering again", "service", inst.Service, "id", inst.ID)
			if err := l.reestablish(); err != nil {
				if adminapi.IsCode(err, adminapi.CodeConflict) {
					// Another registration of the same id took over
					// meanwhile: leave it, as every backend does.
					l.r.log.Info("instance was registered again by another registration meanwhile; leaving it", "service", inst.Service, "id", inst.ID)
					<-l.ctx.Done()
					return
				}
				if l.fatal(err) {
					return
				}
				l.r.log.Warn("could not register again; retrying", "service", inst.Service, "id", inst.ID, "err", err)
				delay, failDelay = failDelay, min(2*failDelay, 2*time.Second)
				continue
			}
			delay, failDelay = interval, 100*time.Millisecond
		default:
			if l.fatal(err) {
				return
			}
			l.r.log.Warn("heartbeat failed; retrying", "service", inst.Service, "id", inst.ID, "err", err)
			delay, failDelay = failDelay, min(2*failDelay, 2*time.Second)
		}
	}
}

// fatal ends the lease when err is a refusal that retrying cannot change.
func (l *lease) fatal(err error) bool {
	for _, code := range []string{adminapi.CodeLaneExpired, adminapi.CodeForbidden, adminapi.CodeUnauthorized} {
		if adminapi.IsCode(err, code) {
			inst := l.Instance()
			l.r.log.Error("registration refused; giving up", "service", inst.Service, "id", inst.ID, "err", err)
			l.finish(fmt.Errorf("%w: %v", registry.ErrLeaseLost, err))
			return true
		}
	}
	return false
}

// reestablish registers the instance under a new registration, unless
// another registration holds it by now.
func (l *lease) reestablish() error {
	if err := l.acquire(l.ctx); err != nil {
		return err
	}
	defer l.release()
	ctx, cancel := context.WithTimeout(l.ctx, timeout)
	defer cancel()
	reg, err := l.r.c.Register(ctx, adminapi.RegisterRequest{Instance: l.Instance(), TTL: adminapi.Duration(l.ttl), IfAbsent: true})
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.reg = reg.Registration
	l.mu.Unlock()
	return nil
}

// sleep waits for d or until ctx is done (false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Watch implements registry.Registry with the admin API's watch stream. The
// stream is opened in the call, so that an unreachable control plane or a
// refused token is returned here. When the stream breaks, the watcher opens
// a new one after a short backoff; its first batch is a reset, as the
// registry contract allows after a relist.
func (r *Registry) Watch(ctx context.Context, service string) (registry.Watcher, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if r.isClosed() {
		return nil, registry.ErrClosed
	}
	// The stream outlives ctx, which only bounds the opening.
	wctx, cancel := context.WithCancel(r.ctx)
	stop := context.AfterFunc(ctx, cancel)
	s, err := r.c.WatchInstances(wctx, service)
	if !stop() {
		if s != nil {
			s.Close()
		}
		cancel()
		return nil, ctx.Err()
	}
	if err != nil {
		cancel()
		return nil, err
	}
	w := &watcher{r: r, service: service, ctx: wctx, cancel: cancel, batches: make(chan registry.Batch), done: make(chan struct{})}
	if !r.spawn(func() { w.run(s) }) {
		cancel()
		s.Close()
		return nil, registry.ErrClosed
	}
	return w, nil
}

type watcher struct {
	r       *Registry
	service string
	ctx     context.Context
	cancel  context.CancelFunc
	batches chan registry.Batch
	done    chan struct{}
	once    sync.Once
}

func (w *watcher) run(s *BatchStream) {
	defer close(w.done)
	backoff := 100 * time.Millisecond
	for {
		err := w.pump(s)
		s.Close()
		if w.ctx.Err() != nil {
			return
		}
		w.r.log.Warn("watch stream ended; watching again", "service", w.service, "err", err)
		for {
			if !sleep(w.ctx, backoff/2+rand.N(backoff/2+1)) {
				return
			}
			backoff = min(2*backoff, 2*time.Second)
			var err error
			s, err = w.r.c.WatchInstances(w.ctx, w.service)
			if err == nil {
				break
			}
			if w.ctx.Err() != nil {
				return
			}
			w.r.log.Warn("could not watch again; retrying", "service", w.service, "err", err)
		}
		backoff = 100 * time.Millisecond
	}
}

// pump delivers the batches of one stream until it breaks.
func (w *watcher) pump(s *BatchStream) error {
	for {
		b, err := s.Next()
		if err != nil {
			return err
		}
		rb := registry.Batch{Reset: b.Reset, Revision: b.Revision, Events: make([]registry.Event, 0, len(b.Events))}
		for _, ev := range b.Events {
			t := registry.EventPut
			if ev.Type == "delete" {
				t = registry.EventDelete
			}
			rb.Events = append(rb.Events, registry.Event{Type: t, Instance: ev.Instance, Revision: ev.Revision})
		}
		select {
		case w.batches <- rb:
		case <-w.ctx.Done():
			return w.ctx.Err()
		}
	}
}

func (w *watcher) Next(ctx context.Context) (registry.Batch, error) {
	select {
	case <-w.ctx.Done():
		return registry.Batch{}, registry.ErrClosed
	default:
	}
	select {
	case b := <-w.batches:
		return b, nil
	case <-ctx.Done():
		return registry.Batch{}, ctx.Err()
	case <-w.ctx.Done():
		return registry.Batch{}, registry.ErrClosed
	}
}

func (w *watcher) Close() error {
	w.once.Do(func() {
		w.cancel()
		<-w.done
	})
	return nil
}

// RegistrationOf returns the registration id (the etcd lease, in hex) that
// holds the instance of a lease returned by Registry.Register, or "" for
// another lease. It changes when the instance had to be registered again;
// claims (Client.Claim) are attached to it.
func RegistrationOf(l registry.Lease) string {
	if al, ok := l.(*lease); ok {
		return al.Registration()
	}
	return ""
}
