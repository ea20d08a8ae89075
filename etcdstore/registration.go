package etcdstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lanesdev/lanes/internal/lib/regid"
	"github.com/lanesdev/lanes/registry"
)

// The key schema of registrations. This file is the only place that writes
// instance keys.
//
//	<prefix>instances/<service>/<id>        the instance, attached to the lease of its registration
//	<prefix>registrations/<owner>/<lease>   {"service", "id"}: who made a registration, attached to its lease

// InstancesPrefix is the key prefix under which every instance is stored.
func (s *Store) InstancesPrefix() string { return string(s.instances) }

// InstanceKey is the key of one instance: <prefix>instances/<service>/<id>.
func (s *Store) InstanceKey(service, id string) string {
	return s.InstancesPrefix() + service + "/" + id
}

func (s *Store) ownerPrefix(owner string) string { return s.prefix + "registrations/" + owner + "/" }

func (s *Store) ownerKey(owner string, id clientv3.LeaseID) string {
	return s.ownerPrefix(owner) + regid.Format(id)
}

// Refusals of Registrations.Create. Each is wrapped in an error that says
// which instance and why.
var (
	// ErrHeld: CreateOptions.IfAbsent, and a registration holds the
	// instance.
	ErrHeld = errors.New("held by another registration")
	// ErrOtherLane: CreateOptions.SameLane, and the instance that holds
	// the ID is in another lane.
	ErrOtherLane = errors.New("registered in another lane")
	// ErrOtherOwner: CreateOptions.SameOwner, and the registration that
	// holds the ID was made by another owner.
	ErrOtherOwner = errors.New("held by a registration of another owner")
	// ErrLimit: the owner holds CreateOptions.MaxPerOwner registrations.
	ErrLimit = errors.New("too many registrations")
	// ErrNoRegistration: the lease has expired or was ended.
	ErrNoRegistration = errors.New("no such registration (it expired, was ended, or was never made)")
)

// Registration is one instance key held by one etcd lease.
type Registration struct {
	Lease    clientv3.LeaseID
	Instance registry.Instance
	// TTL is the lease's TTL as granted (Create) or renewed (Renew).
	TTL time.Duration
}

// CreateOptions are the conditions of Registrations.Create. The zero value
// replaces whatever holds the instance's key, as Store.Register does.
type CreateOptions struct {
	// Owner, when set, is recorded with the registration, so that Owns and
	// Owned can tell who made it. It must be one key segment.
	Owner string
	// IfAbsent registers only when no registration holds the key, or
	// Previous does (a lost lease, being replaced by its own owner).
	IfAbsent bool
	Previous clientv3.LeaseID
	// SameLane refuses to replace an instance registered in another lane.
	SameLane bool
	// SameOwner refuses to replace a registration not made by Owner.
	SameOwner bool
	// MaxPerOwner, when positive, bounds the registrations of Owner alive
	// at once (a registration it replaces does not count).
	MaxPerOwner int
}

// Registrations writes and reads the instance keys and their leases: the
// one place that knows the key format and the lease protocol, as etcd's
// naming/endpoints Manager is for endpoints. Store.Register keeps a
// registration alive from the process it describes; the admin API grants
// registrations on behalf of tokens and renews them on heartbeats. Both
// use these methods.
type Registrations struct{ s *Store }

// Registrations returns the registration manager of the Store.
func (s *Store) Registrations() *Registrations { return &Registrations{s: s} }

// ttlSeconds checks a registration TTL and rounds it up to whole seconds.
func ttlSeconds(ttl time.Duration) (int64, error) {
	switch {
	case ttl < 0:
		return 0, &registry.FieldError{Field: "ttl", Value: ttl.String(), Msg: "must not be negative"}
	case ttl == 0:
		ttl = registry.DefaultTTL
	case ttl < time.Second:
		return 0, &registry.FieldError{Field: "ttl", Value: ttl.String(), Msg: "must be at least 1s (etcd leases count whole seconds)"}
	}
	return int64((ttl + time.Second - 1) / time.Second), nil
}

func laneName(l string) string {
	if l == "" {
		return "the baseline"
	}
	return "lane " + strconv.Quote(l)
}

// Create validates inst, grants a lease of ttl and puts the instance under
// it, on the conditions of o. A refusal wraps ErrHeld, ErrOtherLane,
// ErrOtherOwner or ErrLimit.
func (r *Registrations) Create(ctx context.Context, inst registry.Instance, ttl time.Duration, o CreateOptions) (Registration, error) {
	s := r.s
	if err := ctx.Err(); err != nil {
		return Registration{}, err
	}
	secs, err := ttlSeconds(ttl)
	if err != nil {
		return Registration{}, err
	}
	inst, err = registry.Normalize(inst)
	if err != nil {
		return Registration{}, err
	}
	if strings.Contains(o.Owner, "/") {
		return Registration{}, fmt.Errorf("etcdstore: owner %q: must be one key segment", o.Owner)
	}
	if s.g.Closed() {
		return Registration{}, registry.ErrClosed
	}
	val, err := json.Marshal(inst)
	if err != nil {
		return Registration{}, err
	}
	key := s.InstanceKey(inst.Service, inst.ID)
	what := inst.Service + "/" + inst.ID
	for range 5 {
		var cmps []clientv3.Cmp // none: replace whatever holds the key
		replacesOwn := false
		if o.IfAbsent || o.SameLane || o.SameOwner || o.MaxPerOwner > 0 {
			cmps = []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}
			cur, err := s.client.Get(ctx, key)
			if err != nil {
				return Registration{}, fmt.Errorf("etcdstore: register %s: %w", what, err)
			}
			if len(cur.Kvs) == 1 {
				kv := cur.Kvs[0]
				held := clientv3.LeaseID(kv.Lease)
				if o.IfAbsent && (o.Previous == 0 || held != o.Previous) {
					return Registration{}, fmt.Errorf("instance %s is %w", what, ErrHeld)
				}
				if o.SameLane {
					var old registry.Instance
					if json.Unmarshal(kv.Value, &old) == nil && old.Lane != inst.Lane {
						return Registration{}, fmt.Errorf("instance id %s is %w (%s); it cannot be taken over from %s", what, ErrOtherLane, laneName(old.Lane), laneName(inst.Lane))
					}
				}
				if o.Owner != "" && (o.SameOwner || o.MaxPerOwner > 0) {
					own := false
					if held != 0 {
						if own, err = r.Owns(ctx, o.Owner, held); err != nil {
							return Registration{}, err
						}
					}
					if !own && o.SameOwner {
						return Registration{}, fmt.Errorf("instance %s is %w", what, ErrOtherOwner)
					}
					replacesOwn = own
				}
				cmps = []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)}
			}
		}
		g, err := s.client.Grant(ctx, secs)
		if err != nil {
			return Registration{}, fmt.Errorf("etcdstore: register %s: grant lease: %w", what, err)
		}
		ops := []clientv3.Op{clientv3.OpPut(key, string(val), clientv3.WithLease(g.ID))}
		if o.Owner != "" {
			ref, _ := json.Marshal(struct {
				Service string `json:"service"`
				ID      string `json:"id"`
			}{inst.Service, inst.ID})
			ops = append(ops, clientv3.OpPut(s.ownerKey(o.Owner, g.ID), string(ref), clientv3.WithLease(g.ID)))
		}
		resp, err := s.client.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil || !resp.Succeeded {
			s.revoke(g.ID)
			if err != nil {
				return Registration{}, fmt.Errorf("etcdstore: register %s: %w", what, err)
			}
			continue // changed meanwhile: look again
		}
		if o.MaxPerOwner > 0 && o.Owner != "" {
			// Counted after the put, so that concurrent registrations
			// cannot all pass: each that finds too many withdraws.
			n, err := s.client.Get(ctx, s.ownerPrefix(o.Owner), clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				s.revoke(g.ID)
				return Registration{}, fmt.Errorf("etcdstore: register %s: count registrations: %w", what, err)
			}
			allowed := int64(o.MaxPerOwner)
			if replacesOwn {
				allowed++
			}
			if n.Count > allowed {
				s.revoke(g.ID)
				return Registration{}, fmt.Errorf("%w: %s may hold %d registrations at once", ErrLimit, o.Owner, o.MaxPerOwner)
			}
		}
		return Registration{Lease: g.ID, Instance: inst, TTL: time.Duration(g.TTL) * time.Second}, nil
	}
	return Registration{}, fmt.Errorf("etcdstore: register %s: the instance keeps changing; try again", what)
}

// Update puts inst under the registration lease, only if that registration
// still holds the instance's key; held reports whether it did. inst must be
// normalised (registry.CheckUpdate).
func (r *Registrations) Update(ctx context.Context, lease clientv3.LeaseID, inst registry.Instance) (held bool, err error) {
	return r.put(ctx, lease, inst, clientv3.Compare(clientv3.LeaseValue(r.s.InstanceKey(inst.Service, inst.ID)), "=", lease))
}

// put puts inst under lease if cmp holds.
func (r *Registrations) put(ctx context.Context, lease clientv3.LeaseID, inst registry.Instance, cmp clientv3.Cmp) (bool, error) {
	val, err := json.Marshal(inst)
	if err != nil {
		return false, err
	}
	key := r.s.InstanceKey(inst.Service, inst.ID)
	resp, err := r.s.client.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, string(val), clientv3.WithLease(lease))).Commit()
	if err != nil {
		return false, fmt.Errorf("etcdstore: update %s/%s: %w", inst.Service, inst.ID, err)
	}
	return resp.Succeeded, nil
}

// Renew renews the lease and returns its TTL; it wraps ErrNoRegistration
// when etcd no longer has the lease. Each attempt is bounded by the request
// timeout and then tried again on another member, until ctx is done: a
// member that waits for a leader that does not answer costs one attempt.
func (r *Registrations) Renew(ctx context.Context, lease clientv3.LeaseID) (time.Duration, error) {
	ttl, _, err := r.renew(ctx, lease, r.s.attempt)
	return ttl, err
}

// End revokes the lease: the instance it holds (if it still holds it), its
// owner record, and every other key attached to it (such as claims) are
// deleted. Ending a registration that no longer exists is not an error.
func (r *Registrations) End(ctx context.Context, lease clientv3.LeaseID) error {
	_, err := r.s.client.Revoke(ctx, lease)
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("etcdstore: end registration %s: %w", regid.Format(lease), err)
	}
	return nil
}

// Alive reports whether etcd still has the lease.
func (r *Registrations) Alive(ctx context.Context, lease clientv3.LeaseID) (bool, error) {
	ttl, err := r.s.client.TimeToLive(ctx, lease)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("etcdstore: read registration %s: %w", regid.Format(lease), err)
	}
	return ttl.TTL > 0, nil
}

// Holder returns the registration that holds the instance service/id, if
// any (Lease is 0 for a key put without a lease).
func (r *Registrations) Holder(ctx context.Context, service, id string) (Registration, bool, error) {
	resp, err := r.s.client.Get(ctx, r.s.InstanceKey(service, id))
	if err != nil {
		return Registration{}, false, fmt.Errorf("etcdstore: read instance %s/%s: %w", service, id, err)
	}
	if len(resp.Kvs) == 0 {
		return Registration{}, false, nil
	}
	inst, err := r.s.decode(resp.Kvs[0])
	if err != nil {
		return Registration{}, false, fmt.Errorf("etcdstore: instance %s/%s: %w", service, id, err)
	}
	return Registration{Lease: clientv3.LeaseID(resp.Kvs[0].Lease), Instance: inst}, true, nil
}

// List returns the registrations of the instances of service (of every
// service when ""), skipping values that are not valid instances.
func (r *Registrations) List(ctx context.Context, service string) ([]Registration, error) {
	pfx := r.s.InstancesPrefix()
	if service != "" {
		pfx += service + "/"
	}
	resp, err := r.s.client.Get(ctx, pfx, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("etcdstore: list instances: %w", err)
	}
	out := make([]Registration, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		inst, err := r.s.decode(kv)
		if err != nil {
			continue // the watches log and skip such values
		}
		out = append(out, Registration{Lease: clientv3.LeaseID(kv.Lease), Instance: inst})
	}
	return out, nil
}

// Holds returns the instances that the registration lease holds.
func (r *Registrations) Holds(ctx context.Context, lease clientv3.LeaseID) ([]registry.Instance, error) {
	ttl, err := r.s.client.TimeToLive(ctx, lease, clientv3.WithAttachedKeys())
	if errors.Is(err, rpctypes.ErrLeaseNotFound) || err == nil && ttl.TTL <= 0 {
		return nil, fmt.Errorf("registration %s: %w", regid.Format(lease), ErrNoRegistration)
	}
	if err != nil {
		return nil, fmt.Errorf("etcdstore: read registration %s: %w", regid.Format(lease), err)
	}
	var out []registry.Instance
	for _, k := range ttl.Keys {
		service, id, ok := r.s.splitKey(k)
		if !ok {
			continue
		}
		if h, ok, err := r.Holder(ctx, service, id); err != nil {
			return nil, err
		} else if ok && h.Lease == lease {
			out = append(out, h.Instance)
		}
	}
	return out, nil
}

// Owns reports whether owner made the registration lease (and it is alive).
func (r *Registrations) Owns(ctx context.Context, owner string, lease clientv3.LeaseID) (bool, error) {
	resp, err := r.s.client.Get(ctx, r.s.ownerKey(owner, lease), clientv3.WithCountOnly())
	if err != nil {
		return false, fmt.Errorf("etcdstore: read registration %s: %w", regid.Format(lease), err)
	}
	return resp.Count > 0, nil
}

// Owned returns the leases of the registrations that owner made and that
// are alive.
func (r *Registrations) Owned(ctx context.Context, owner string) (map[clientv3.LeaseID]bool, error) {
	pfx := r.s.ownerPrefix(owner)
	resp, err := r.s.client.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("etcdstore: list registrations: %w", err)
	}
	out := make(map[clientv3.LeaseID]bool, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		if id, ok := regid.Parse[clientv3.LeaseID](strings.TrimPrefix(string(kv.Key), pfx)); ok {
			out[id] = true
		}
	}
	return out, nil
}

// Remove deletes the instance service/id whatever holds it, and ends the
// registration that held it. It reports whether there was one.
func (r *Registrations) Remove(ctx context.Context, service, id string) (bool, error) {
	key := r.s.InstanceKey(service, id)
	resp, err := r.s.client.Delete(ctx, key, clientv3.WithPrevKV())
	if err != nil {
		return false, fmt.Errorf("etcdstore: delete instance %s/%s: %w", service, id, err)
	}
	if len(resp.PrevKvs) == 0 {
		return false, nil
	}
	if l := clientv3.LeaseID(resp.PrevKvs[0].Lease); l != 0 {
		if err := r.End(ctx, l); err != nil {
			return true, err
		}
	}
	return true, nil
}

// revoke revokes id, best effort and bounded; the lease expires anyway.
func (s *Store) revoke(id clientv3.LeaseID) error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	return s.Registrations().End(ctx, id)
}
