package etcdstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lanesdev/lanes/registry"
)

// Register implements registry.Registry.
//
// The instance is put at <prefix>instances/<service>/<id> with a lease of
// ttl, rounded up to whole seconds; ttl must be at least one second. etcd
// raises a TTL below its own minimum (1.5 election timeouts: 2s with the
// default 1s election timeout) to that minimum.
//
// A goroutine owned by the Lease renews the lease. If the lease is lost
// anyway (etcd was unreachable for longer than the TTL and the lease
// expired), it grants a new lease and puts the instance again, retrying with
// backoff until Lease.Close; the instance is missing from watches only for
// that gap. It does not overwrite a registration of the same ID made in the
// meantime by another lease.
func (s *Store) Register(ctx context.Context, inst registry.Instance, ttl time.Duration) (registry.Lease, error) {
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
	if s.isClosed() {
		return nil, registry.ErrClosed
	}
	val, err := json.Marshal(inst)
	if err != nil {
		return nil, err
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	key := s.InstanceKey(inst.Service, inst.ID)
	g, err := s.client.Grant(ctx, secs)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: register %s/%s: grant lease: %w", inst.Service, inst.ID, err)
	}
	if _, err := s.client.Put(ctx, key, string(val), clientv3.WithLease(g.ID)); err != nil {
		s.revoke(g.ID)
		return nil, fmt.Errorf("etcdstore: register %s/%s: %w", inst.Service, inst.ID, err)
	}
	l := &lease{
		s:        s,
		key:      key,
		ttl:      secs,
		inst:     inst,
		id:       g.ID,
		sem:      make(chan struct{}, 1),
		loopDone: make(chan struct{}),
		done:     make(chan struct{}),
	}
	l.ctx, l.cancel = context.WithCancel(s.ctx)
	if !s.spawn(l.keepAlive) {
		l.cancel()
		s.revoke(g.ID)
		return nil, registry.ErrClosed
	}
	return l, nil
}

// revoke revokes id, best effort and bounded; the lease expires anyway.
func (s *Store) revoke(id clientv3.LeaseID) error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	_, err := s.client.Revoke(ctx, id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		err = nil
	}
	return err
}

// lease is a registry.Lease on etcd.
type lease struct {
	s   *Store
	key string
	ttl int64 // seconds

	ctx      context.Context // cancelled by Close and by Store.Close
	cancel   context.CancelFunc
	sem      chan struct{} // held while writing the key: Update and re-registration
	loopDone chan struct{} // closed when keepAlive returns

	mu        sync.Mutex
	inst      registry.Instance
	id        clientv3.LeaseID
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

func (l *lease) leaseID() clientv3.LeaseID {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.id
}

func (l *lease) Done() <-chan struct{} { return l.done }

func (l *lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// finish ends the lease with err, once.
func (l *lease) finish(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = err
		close(l.done)
	}
}

// acquire takes l.sem, or fails when ctx or the lease is done.
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

// Update implements registry.Lease. It puts the instance under the same
// lease, only if the key is still held by this lease: when another
// registration has replaced this one, Update changes what Instance returns
// and nothing in etcd. While the lease is being re-established, the new
// instance is what gets registered again.
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
	val, err := json.Marshal(inst)
	if err != nil {
		return err
	}
	if err := l.acquire(ctx); err != nil {
		return err
	}
	defer l.release()
	id := l.leaseID()
	_, err = l.s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(l.key), "=", id)).
		Then(clientv3.OpPut(l.key, string(val), clientv3.WithLease(id))).
		Commit()
	if err != nil {
		return fmt.Errorf("etcdstore: update %s/%s: %w", inst.Service, inst.ID, err)
	}
	l.mu.Lock()
	l.inst = inst
	l.mu.Unlock()
	return nil
}

// Close implements registry.Lease: it stops the renewing goroutine, then
// revokes the lease, which deletes the key (if this lease still holds it).
// The revoke is bounded by a few seconds; if etcd cannot be reached, the
// key is deleted when the lease expires and Close returns the error.
func (l *lease) Close() error {
	l.closeOnce.Do(func() {
		l.cancel()
		<-l.loopDone
		if !l.s.isClosed() {
			if err := l.s.revoke(l.leaseID()); err != nil {
				l.closeErr = fmt.Errorf("etcdstore: deregister %s: %w (the lease expires within its TTL)", l.key, err)
			}
		}
		l.finish(registry.ErrClosed)
	})
	return l.closeErr
}

// keepAlive renews the lease until l.ctx is cancelled, re-establishing the
// registration whenever the lease is lost. It is the lease's goroutine.
func (l *lease) keepAlive() {
	defer close(l.loopDone)
	defer func() {
		if l.s.ctx.Err() != nil {
			l.finish(registry.ErrClosed)
		}
	}()
	bo := newBackoff(100*time.Millisecond, 2*time.Second)
	for {
		id := l.leaseID()
		start := time.Now()
		ch, err := l.s.client.KeepAlive(l.ctx, id)
		if err == nil {
			for range ch {
				// Each response is a renewal; nothing to do.
			}
		}
		if l.ctx.Err() != nil {
			return
		}
		if l.s.client.Ctx().Err() != nil {
			l.s.log.Error("etcd client closed; giving up the lease", "key", l.key)
			l.finish(fmt.Errorf("%w: the etcd client was closed", registry.ErrLeaseLost))
			return
		}
		if err != nil {
			l.s.log.Warn("lease keep-alive failed; registering again", "key", l.key, "lease", fmt.Sprintf("%x", id), "err", err)
		} else {
			l.s.log.Warn("lease keep-alive ended (lease expired or etcd unreachable for its TTL); registering again", "key", l.key, "lease", fmt.Sprintf("%x", id))
		}
		if time.Since(start) > time.Duration(l.ttl)*time.Second {
			bo.reset()
		} else if !bo.wait(l.ctx) { // do not spin if renewals keep failing at once
			return
		}
		if !l.reestablish(bo) {
			return
		}
	}
}

// reestablish makes sure that the key is registered under a live lease of
// ours: the current one if etcd still has it, else a new one. It retries with
// bo until it succeeds (true) or l.ctx is done (false).
func (l *lease) reestablish(bo *backoff) bool {
	for {
		done, err := l.tryReestablish()
		if l.ctx.Err() != nil {
			return false
		}
		if err == nil {
			return done
		}
		l.s.log.Warn("could not register again; retrying", "key", l.key, "err", err)
		if !bo.wait(l.ctx) {
			return false
		}
	}
}

func (l *lease) tryReestablish() (bool, error) {
	if err := l.acquire(l.ctx); err != nil {
		return false, nil
	}
	defer l.release()
	ctx, cancel := context.WithTimeout(l.ctx, opTimeout)
	defer cancel()

	inst := l.Instance()
	val, err := json.Marshal(inst)
	if err != nil {
		return false, err
	}
	put := func(id clientv3.LeaseID) clientv3.Op {
		return clientv3.OpPut(l.key, string(val), clientv3.WithLease(id))
	}
	absent := clientv3.Compare(clientv3.CreateRevision(l.key), "=", 0)

	// Renewing once tells whether etcd still has the lease, and makes sure
	// it does for another TTL. (A lease that has expired but is not yet
	// revoked is not renewed: etcd answers once it is revoked.)
	old := l.leaseID()
	_, err = l.s.client.KeepAliveOnce(ctx, old)
	switch {
	case err == nil:
		// Still alive: etcd was only unreachable for a while. Put the
		// instance back only if someone deleted the key meanwhile.
		if _, err := l.s.client.Txn(ctx).If(absent).Then(put(old)).Commit(); err != nil {
			return false, fmt.Errorf("put instance: %w", err)
		}
		return true, nil
	case !errors.Is(err, rpctypes.ErrLeaseNotFound):
		return false, fmt.Errorf("renew lease: %w", err)
	}

	g, err := l.s.client.Grant(ctx, l.ttl)
	if err != nil {
		return false, fmt.Errorf("grant lease: %w", err)
	}
	l.mu.Lock()
	l.id = g.ID
	l.mu.Unlock()
	l.s.log.Info("lease was lost; registering under a new lease", "key", l.key, "old_lease", fmt.Sprintf("%x", old), "lease", fmt.Sprintf("%x", g.ID))

	// Put the instance if the key is gone, or still held by the old lease
	// (expired, about to be revoked); leave it if another registration has
	// taken it over since.
	resp, err := l.s.client.Txn(ctx).
		If(absent).
		Then(put(g.ID)).
		Else(clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(l.key), "=", old)},
			[]clientv3.Op{put(g.ID)},
			[]clientv3.Op{clientv3.OpGet(l.key)})).
		Commit()
	if err != nil {
		return false, fmt.Errorf("put instance: %w", err)
	}
	if !resp.Succeeded && !resp.Responses[0].GetResponseTxn().GetSucceeded() {
		l.s.log.Info("instance was registered again by another lease meanwhile; leaving it", "key", l.key)
	}
	return true, nil
}
