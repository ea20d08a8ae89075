package adminclient

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/lib/backoff"
	"github.com/lanesdev/lanes/internal/lib/gogroup"
	"github.com/lanesdev/lanes/internal/lib/localip"
	"github.com/lanesdev/lanes/registry"
)

// Registry is a registry.Registry over the admin API: registrations are
// etcd leases that the control plane grants, kept alive by heartbeats this
// Registry sends, and watches are streams of batches.
//
// What the token allows decides what Register accepts: a lane token
// registers instances of its lane only, a baseline token baseline instances
// only, and the admin token anything, within the token's limits. A
// registration belongs to the token that made it: another token cannot
// renew, update, end or replace it (an id held by another token's
// registration is refused with CodeConflict). Any token may watch. The
// leases are registry.KeptLease, as every backend's.
//
// A heartbeat that finds the registration gone (the process was suspended
// for longer than the TTL, or the control plane lost it) registers the
// instance again, unless another registration of the same id has taken its
// place. A registration ends for good — Lease.Done is closed and Lease.Err
// wraps registry.ErrLeaseLost — when the control plane refuses it: its lane
// has expired, or its token was revoked.
type Registry struct {
	c       *Client
	log     *slog.Logger
	g       *gogroup.Group       // heartbeats and watches
	outages registry.OutageClock // see LastOutage
}

var (
	_ registry.Registry = (*Registry)(nil)
	_ registry.Outages  = (*Registry)(nil)
	_ registry.Reacher  = (*Registry)(nil)
)

// LocalIP implements registry.Reacher: the local IP address of this host's
// route to the admin API.
func (r *Registry) LocalIP() net.IP { return localip.Toward(r.c.URL()) }

// LastOutage implements registry.Outages: it returns when the Registry last
// could not reach the control plane (a heartbeat failed, a watch stream
// broke) or found a registration expired. A routing engine on the
// Registry holds the instances deleted shortly after.
func (r *Registry) LastOutage() time.Time { return r.outages.Last() }

// RegistryOption configures a Registry.
type RegistryOption func(*Registry)

// WithLogger sets the logger of heartbeat and watch troubles (default
// slog.Default()).
func WithLogger(l *slog.Logger) RegistryOption { return func(r *Registry) { r.log = l } }

// NewRegistry returns a Registry that registers and watches through c.
// Closing the Registry does not close c.
func NewRegistry(c *Client, opts ...RegistryOption) *Registry {
	r := &Registry{c: c, log: slog.Default(), g: gogroup.New()}
	for _, o := range opts {
		o(r)
	}
	r.log = r.log.With("component", "adminclient")
	return r
}

// Close stops every heartbeat and watch, without deregistering: the
// instances disappear when their TTL runs out. Close the leases first for a
// clean deregistration. It is safe to call more than once.
func (r *Registry) Close() error {
	r.g.Close()
	return nil
}

// Register implements registry.Registry. It validates inst locally first,
// so that a bad field is a *registry.FieldError as with every backend; a
// refusal by the control plane (token scope, expired lane, an id held by
// another lane or registration, a limit) is an *adminapi.Error.
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
	if r.g.Closed() {
		return nil, registry.ErrClosed
	}
	reg, err := r.c.Register(ctx, adminapi.RegisterRequest{Instance: inst, TTL: adminapi.Duration(ttl)})
	if err != nil {
		return nil, err
	}
	k := &keeper{r: r, ttl: ttl, reg: reg.Registration}
	l := registry.NewKeptLease(r.g.Context(), reg.Instance, k, r.log)
	k.lease = l
	if !l.Start(r.g.Go) {
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

// keeper keeps one registration alive with heartbeats: the
// registry.Keeper over the admin API.
type keeper struct {
	r     *Registry
	ttl   time.Duration
	lease *registry.KeptLease

	mu  sync.Mutex
	reg string
}

// Registration returns the registration id (the etcd lease, in hex) that
// currently holds the instance: the keeper is a regid.Holder.
func (k *keeper) Registration() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.reg
}

// Keep implements registry.Keeper: it renews the registration every third
// of its TTL, retrying failed heartbeats with backoff, until the control
// plane says the registration is gone (it is then made again) or refuses
// it (the lease ends).
func (k *keeper) Keep(ctx context.Context) error {
	interval := max(k.ttl/3, 300*time.Millisecond)
	delay := interval
	failDelay := 100 * time.Millisecond
	for {
		if !backoff.Sleep(ctx, delay) {
			return ctx.Err()
		}
		inst := k.lease.Instance()
		sent := time.Now()
		hctx, cancel := context.WithTimeout(ctx, min(timeout, k.ttl))
		_, err := k.r.c.Heartbeat(hctx, inst.Service, inst.ID, k.Registration())
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err == nil:
			if time.Since(sent) > interval { // the control plane stalled meanwhile
				k.r.outages.Mark(time.Now())
			}
			delay, failDelay = interval, 100*time.Millisecond
		case adminapi.IsCode(err, adminapi.CodeNotFound):
			k.r.outages.Mark(time.Now())                        // expired: others too, perhaps
			return fmt.Errorf("%w (%w)", err, registry.ErrGone) // register again, at once
		case fatal(err):
			return fmt.Errorf("%w: %v", registry.ErrLeaseLost, err)
		default:
			k.r.outages.Mark(time.Now())
			k.r.log.Warn("heartbeat failed; retrying", "service", inst.Service, "id", inst.ID, "err", err)
			delay, failDelay = failDelay, min(2*failDelay, 2*time.Second)
		}
	}
}

// fatal reports whether err is a refusal that retrying cannot change.
func fatal(err error) bool {
	for _, code := range []string{adminapi.CodeLaneExpired, adminapi.CodeForbidden, adminapi.CodeUnauthorized} {
		if adminapi.IsCode(err, code) {
			return true
		}
	}
	return false
}

// Restore implements registry.Keeper: it registers the instance under a
// new registration, unless another registration holds it by now.
func (k *keeper) Restore(ctx context.Context, inst registry.Instance) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	reg, err := k.r.c.Register(ctx, adminapi.RegisterRequest{Instance: inst, TTL: adminapi.Duration(k.ttl), IfAbsent: true})
	switch {
	case adminapi.IsCode(err, adminapi.CodeConflict):
		return registry.ErrTakenOver
	case fatal(err):
		return fmt.Errorf("%w: %v", registry.ErrLeaseLost, err)
	case err != nil:
		return err
	}
	k.mu.Lock()
	k.reg = reg.Registration
	k.mu.Unlock()
	return nil
}

// Put implements registry.Keeper: the instance is put under the same
// registration, only if that registration still holds it.
func (k *keeper) Put(ctx context.Context, inst registry.Instance) error {
	_, err := k.r.c.Register(ctx, adminapi.RegisterRequest{Instance: inst, TTL: adminapi.Duration(k.ttl), Registration: k.Registration()})
	return err
}

// Release implements registry.Keeper: ending the registration removes the
// instance (if this registration still holds it) and any claim attached to
// it.
func (k *keeper) Release(ctx context.Context) error {
	err := k.r.c.Deregister(ctx, k.lease.Instance().Service, k.lease.Instance().ID, k.Registration())
	if adminapi.IsCode(err, adminapi.CodeNotFound) {
		err = nil
	}
	return err
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
	w := &watcher{r: r, service: service, batches: make(chan registry.Batch), done: make(chan struct{})}
	if err := openStream(ctx, r, func(ctx context.Context) (*BatchStream, error) { return r.c.WatchInstances(ctx, service) }, w.bind); err != nil {
		return nil, err
	}
	return w, nil
}

// openStream opens a stream with open, under a context that outlives ctx
// (ctx only bounds the opening) and ends with the Registry. It hands that
// context and its cancel to bind, then runs what bind returns with the
// stream in a goroutine of the Registry. It fails with registry.ErrClosed
// once the Registry is closed.
func openStream[S io.Closer](ctx context.Context, r *Registry, open func(context.Context) (S, error), bind func(context.Context, context.CancelFunc) func(S)) error {
	if r.g.Closed() {
		return registry.ErrClosed
	}
	sctx, cancel := context.WithCancel(r.g.Context())
	stop := context.AfterFunc(ctx, cancel)
	s, err := open(sctx)
	if !stop() {
		if err == nil {
			s.Close()
		}
		cancel()
		return ctx.Err()
	}
	if err != nil {
		cancel()
		return err
	}
	run := bind(sctx, cancel)
	if !r.g.Go(func() { run(s) }) {
		cancel()
		s.Close()
		return registry.ErrClosed
	}
	return nil
}

// stalledStream is a silence of a watch stream that its keep-alives rule
// out: the control plane stalled.
const stalledStream = adminapi.WatchKeepAlive * 3 / 2

type watcher struct {
	r       *Registry
	service string
	ctx     context.Context
	cancel  context.CancelFunc
	batches chan registry.Batch
	done    chan struct{}
	once    sync.Once
}

func (w *watcher) bind(ctx context.Context, cancel context.CancelFunc) func(*BatchStream) {
	w.ctx, w.cancel = ctx, cancel
	return w.run
}

func (w *watcher) run(s *BatchStream) {
	defer close(w.done)
	bo := backoff.New(100*time.Millisecond, 2*time.Second)
	for {
		err := w.pump(s)
		s.Close()
		if w.ctx.Err() != nil {
			return
		}
		w.r.outages.Mark(time.Now())
		w.r.log.Warn("watch stream ended; watching again", "service", w.service, "err", err)
		for {
			if !bo.Wait(w.ctx) {
				return
			}
			var err error
			s, err = w.r.c.WatchInstances(w.ctx, w.service)
			if err == nil {
				w.r.outages.Mark(time.Now()) // back
				break
			}
			if w.ctx.Err() != nil {
				return
			}
			w.r.log.Warn("could not watch again; retrying", "service", w.service, "err", err)
		}
		bo.Reset()
	}
}

// pump delivers the batches of one stream until it breaks.
func (w *watcher) pump(s *BatchStream) error {
	for {
		b, err := s.Next()
		if err != nil {
			return err
		}
		if s.Gap() > stalledStream {
			w.r.outages.Mark(time.Now()) // before the changes it held back
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
