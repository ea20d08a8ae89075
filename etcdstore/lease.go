package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

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
	reg, err := s.Registrations().Create(ctx, inst, ttl, CreateOptions{})
	if err != nil {
		return nil, err
	}
	k := &keeper{r: s.Registrations(), id: reg.Lease, secs: int64(reg.TTL / time.Second)}
	if k.secs <= 0 {
		k.secs, _ = ttlSeconds(ttl)
	}
	l := registry.NewKeptLease(s.g.Context(), reg.Instance, k, s.log)
	if !l.Start(s.g.Go) {
		s.revoke(reg.Lease)
		return nil, registry.ErrClosed
	}
	return l, nil
}

// keeper keeps one registration of Store.Register alive: the
// registry.Keeper on etcd.
type keeper struct {
	r    *Registrations
	secs int64 // the TTL asked for

	mu sync.Mutex
	id clientv3.LeaseID
}

func (k *keeper) lease() clientv3.LeaseID {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.id
}

// Keep implements registry.Keeper with etcd's keep-alive stream, which
// ends when the lease expired or etcd could not be reached for its TTL.
func (k *keeper) Keep(ctx context.Context) error {
	s := k.r.s
	ch, err := s.client.KeepAlive(ctx, k.lease())
	if err == nil {
		for range ch {
			// Each response is a renewal; nothing to do.
		}
	}
	if ctx.Err() == nil && s.client.Ctx().Err() != nil {
		return fmt.Errorf("%w: the etcd client was closed", registry.ErrLeaseLost)
	}
	if err == nil {
		err = errors.New("keep-alive ended (lease expired or etcd unreachable for its TTL)")
	}
	return err
}

// Restore implements registry.Keeper: it makes sure that the key is
// registered under a live lease of ours, the current one if etcd still has
// it, else a new one.
func (k *keeper) Restore(ctx context.Context, inst registry.Instance) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	key := k.r.s.InstanceKey(inst.Service, inst.ID)
	old := k.lease()
	// Renewing once tells whether etcd still has the lease, and makes sure
	// it does for another TTL. (A lease that has expired but is not yet
	// revoked is not renewed: etcd answers once it is revoked.)
	_, err := k.r.Renew(ctx, old)
	switch {
	case err == nil:
		// Still alive: etcd was only unreachable for a while. Put the
		// instance back only if someone deleted the key meanwhile.
		if _, err := k.r.put(ctx, old, inst, clientv3.Compare(clientv3.CreateRevision(key), "=", 0)); err != nil {
			return err
		}
		return nil
	case !errors.Is(err, ErrNoRegistration):
		return err
	}
	// Put the instance if the key is gone, or still held by the old lease
	// (expired, about to be revoked); leave it if another registration has
	// taken it over since.
	reg, err := k.r.Create(ctx, inst, time.Duration(k.secs)*time.Second, CreateOptions{IfAbsent: true, Previous: old})
	if errors.Is(err, ErrHeld) {
		return registry.ErrTakenOver
	}
	if err != nil {
		return err
	}
	k.mu.Lock()
	k.id = reg.Lease
	k.mu.Unlock()
	k.r.s.log.Info("lease was lost; registered under a new lease", "key", key, "old_lease", FormatLease(old), "lease", FormatLease(reg.Lease))
	return nil
}

// Put implements registry.Keeper: the instance is put under the same lease
// only if the key is still held by it; when another registration has
// replaced this one, nothing changes in etcd.
func (k *keeper) Put(ctx context.Context, inst registry.Instance) error {
	_, err := k.r.Update(ctx, k.lease(), inst)
	return err
}

// Release implements registry.Keeper: revoking the lease deletes the key
// (if this lease still holds it).
func (k *keeper) Release(ctx context.Context) error {
	return k.r.End(ctx, k.lease())
}
