package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lanesdev/lanes/internal/lib/backoff"
	"github.com/lanesdev/lanes/internal/lib/regid"
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
	granted := time.Now()
	reg, err := s.Registrations().Create(ctx, inst, ttl, CreateOptions{})
	if err != nil {
		return nil, err
	}
	k := &keeper{r: s.Registrations(), key: s.InstanceKey(reg.Instance.Service, reg.Instance.ID), secs: int64(reg.TTL / time.Second)}
	if k.secs <= 0 { // etcd always says; the TTL asked for, else
		k.secs, _ = ttlSeconds(ttl)
	}
	k.set(reg.Lease, reg.TTL, granted)
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
	key  string // the instance's
	secs int64  // the TTL asked for

	mu      sync.Mutex
	id      clientv3.LeaseID
	ttl     time.Duration // as etcd last granted it
	renewed time.Time     // etcd renewed the lease for ttl after this
}

func (k *keeper) lease() clientv3.LeaseID {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.id
}

// state returns the lease, its TTL and when it was last renewed.
func (k *keeper) state() (clientv3.LeaseID, time.Duration, time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.id, k.ttl, k.renewed
}

// set records that lease was granted or renewed for ttl after at (0: the
// TTL asked for, k.secs).
func (k *keeper) set(lease clientv3.LeaseID, ttl time.Duration, at time.Time) {
	if ttl <= 0 {
		ttl = time.Duration(k.secs) * time.Second
	}
	k.mu.Lock()
	k.id, k.ttl, k.renewed = lease, ttl, at
	k.mu.Unlock()
	if f := k.r.s.renewed; f != nil {
		f(k.key, lease, at)
	}
}

// Keep implements registry.Keeper: it renews the lease every third of its
// TTL (see Registrations.renew) and returns once the lease expired, or
// could not be renewed within its TTL of the last renewal.
//
// It does not use the etcd client's KeepAlive. That sends the renewals of
// every lease of the client on one stream, which a member serves one
// renewal at a time, and a follower forwards each to the leader: a
// renewal that reached a follower just before the leader stopped answering
// (paused, cut off) waits for it for etcd's request timeout (7s with the
// default 1s election timeout), although a new leader serves after one or
// two seconds, and every renewal of the stream waits behind it. The
// follower answers the member checks all along, so nothing moves the
// stream; the client gives up on a lease only after its TTL.
func (k *keeper) Keep(ctx context.Context) error {
	s := k.r.s
	for {
		lease, ttl, renewed := k.state()
		if !backoff.Sleep(ctx, time.Until(renewed.Add(ttl/3))) {
			return ctx.Err()
		}
		// Past the TTL, etcd may have revoked the lease: Restore finds
		// out.
		rctx, cancel := context.WithDeadline(ctx, renewed.Add(ttl))
		got, sent, err := k.r.renew(rctx, lease, renewAttempt(s.attempt, ttl))
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if s.client.Ctx().Err() != nil {
			return fmt.Errorf("%w: the etcd client was closed", registry.ErrLeaseLost)
		}
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("lease %s not renewed within its TTL of %s: %w", regid.Format(lease), ttl, err)
			}
			if errors.Is(err, ErrNoRegistration) {
				return fmt.Errorf("%w (%w)", err, registry.ErrGone) // made again at once
			}
			return err
		}
		k.set(lease, got, sent)
	}
}

// renewAttempt bounds one attempt of a renewal: the request timeout, but
// no more than a quarter of the TTL (with at least 500ms), so that the
// attempts after a renewal stuck on one member still fit in the TTL.
func renewAttempt(request, ttl time.Duration) time.Duration {
	return min(request, max(ttl/4, 500*time.Millisecond))
}

// renew renews lease until etcd answers, or ctx is done: each attempt, on a
// keep-alive stream of its own, is bounded by attempt and then given up
// for another, which the client's balancer sends to another member. It
// returns the TTL etcd granted and when the attempt it answered was sent
// (the lease lasts for the TTL from then at least); ErrNoRegistration when
// etcd no longer has the lease.
func (r *Registrations) renew(ctx context.Context, lease clientv3.LeaseID, attempt time.Duration) (time.Duration, time.Time, error) {
	s := r.s
	bo := backoff.New(50*time.Millisecond, 500*time.Millisecond)
	for {
		sent := time.Now()
		actx, cancel := context.WithTimeout(ctx, attempt)
		secs, err := r.renewOnce(actx, lease)
		timedOut := actx.Err() != nil
		cancel()
		switch {
		case err == nil && secs > 0:
			return time.Duration(secs) * time.Second, sent, nil
		case err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound):
			return 0, sent, fmt.Errorf("registration %s: %w", regid.Format(lease), ErrNoRegistration)
		case ctx.Err() != nil:
			return 0, sent, fmt.Errorf("etcdstore: renew registration %s: %w (last attempt: %v)", regid.Format(lease), ctx.Err(), err)
		case s.client.Ctx().Err() != nil:
			return 0, sent, fmt.Errorf("etcdstore: renew registration %s: %w", regid.Format(lease), s.client.Ctx().Err())
		case !timedOut && !retryable(err):
			return 0, sent, fmt.Errorf("etcdstore: renew registration %s: %w", regid.Format(lease), err)
		}
		// etcd could not be reached: it may expire the leases it could
		// not renew (see registry.Outages).
		s.outages.Mark(time.Now())
		// An attempt that failed at once (no leader, no connection) is
		// tried again after a pause; one that ran out of time, at once.
		if !timedOut && !bo.Wait(ctx) {
			return 0, sent, fmt.Errorf("etcdstore: renew registration %s: %w (last attempt: %v)", regid.Format(lease), ctx.Err(), err)
		}
	}
}

// renewOnce asks etcd once to renew lease, on a keep-alive stream that
// serves no other renewal meanwhile (see renewals). A member without a
// leader refuses at once. It returns the TTL etcd granted (0: no such
// lease).
func (r *Registrations) renewOnce(ctx context.Context, lease clientv3.LeaseID) (int64, error) {
	s := r.s
	if s.renewals == nil {
		ka, err := s.client.KeepAliveOnce(ctx, lease)
		if err != nil {
			return 0, err
		}
		return ka.TTL, nil
	}
	return s.renewals.renew(ctx, lease)
}

// renewals are the Store's lease keep-alive streams. A renewal takes a
// stream of its own, so that one stuck on a member (waiting for a leader
// that does not answer) holds up no other renewal, as the etcd client's
// KeepAlive would with its one stream for every lease. A stream that
// answered goes back for the next renewal; one that failed, or did not
// answer in time (which also ends the renewal on the member), is ended.
//
// Streams are kept rather than opened per renewal because, with a username
// and password, the etcd client logs in again for every stream it opens:
// an Authenticate call, which costs the member a bcrypt hash and a raft
// write. A stream per renewal cost one log-in per renewal. A stream is
// used for renewStreamAge at most, so that the client still logs in about
// once a minute while it renews: that keeps its auth token fresh for its
// other requests (etcd 3.4 does not check tokens on renewals, so a token
// used for nothing else would expire, and there a client of New cannot log
// in again once its token has expired: see members.logInConn).
type renewals struct {
	client pb.LeaseClient
	ctx    context.Context // ends with the Store, and every stream with it

	mu   sync.Mutex
	idle []*renewStream // the most recently used last
}

// Bounds of the renewal streams: at most maxIdleRenewals are kept idle,
// and one opened renewStreamAge ago is ended instead of being used again.
const (
	maxIdleRenewals = 32
	renewStreamAge  = time.Minute
)

// renewStream is one lease keep-alive stream, opened with require-leader
// (a member that loses its leader ends it).
type renewStream struct {
	ctx    context.Context
	cancel context.CancelFunc
	st     pb.Lease_LeaseKeepAliveClient // nil until start
	opened time.Time
}

// expired reports whether rs was opened renewStreamAge ago: it is ended
// rather than used again.
func (rs *renewStream) expired(now time.Time) bool {
	return now.Sub(rs.opened) >= renewStreamAge
}

func newRenewals(ctx context.Context, client pb.LeaseClient) *renewals {
	return &renewals{client: client, ctx: ctx}
}

// renew renews lease once, within ctx, on an idle stream or a new one.
// A kept stream that fails at once (its connection was closed, its member
// lost its leader, the client's auth token expired) gives way to the next,
// and then to a new one. When ctx ends first, which ends the stream, the
// idle streams are ended too: they may be on the same stuck member, and new
// ones go wherever the client's balancer sends them.
func (p *renewals) renew(ctx context.Context, lease clientv3.LeaseID) (int64, error) {
	for {
		rs := p.take()
		kept := rs != nil
		if !kept {
			rs = p.open()
		}
		// The stream outlives ctx: the end of ctx (the attempt's bound)
		// ends the stream instead, and the opening of a new one.
		stop := context.AfterFunc(ctx, rs.cancel)
		var ttl int64
		err := rs.start(p.client)
		if err == nil {
			ttl, err = rs.exchange(lease)
		}
		live := stop()
		switch {
		case err == nil && live:
			p.put(rs)
			return ttl, nil
		case err == nil:
			return ttl, nil
		}
		rs.cancel()
		if !live || ctx.Err() != nil {
			p.flush()
			return 0, err
		}
		if !kept || !retryable(err) {
			return 0, err
		}
	}
}

// exchange sends one renewal of lease and reads its answer.
func (rs *renewStream) exchange(lease clientv3.LeaseID) (int64, error) {
	if err := rs.st.Send(&pb.LeaseKeepAliveRequest{ID: int64(lease)}); err != nil {
		if _, rerr := rs.st.Recv(); rerr != nil {
			err = rerr // the stream's own error, not io.EOF
		}
		return 0, rpctypes.Error(err)
	}
	resp, err := rs.st.Recv()
	if err != nil {
		return 0, rpctypes.Error(err)
	}
	if resp.ID != int64(lease) {
		return 0, fmt.Errorf("etcdstore: renewal of lease %s answered for lease %s", regid.Format(lease), regid.Format(clientv3.LeaseID(resp.ID)))
	}
	return resp.TTL, nil
}

// take takes the most recently used idle stream, if any.
func (p *renewals) take() *renewStream {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prune(time.Now())
	n := len(p.idle)
	if n == 0 {
		return nil
	}
	rs := p.idle[n-1]
	p.idle[n-1] = nil
	p.idle = p.idle[:n-1]
	return rs
}

// open makes a stream that start opens.
func (p *renewals) open() *renewStream {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(p.ctx))
	return &renewStream{ctx: ctx, cancel: cancel, opened: time.Now()}
}

// start opens the stream, unless it is open.
func (rs *renewStream) start(client pb.LeaseClient) error {
	if rs.st != nil {
		return nil
	}
	st, err := client.LeaseKeepAlive(rs.ctx, grpc.WaitForReady(true))
	if err != nil {
		return rpctypes.Error(err)
	}
	rs.st = st
	return nil
}

// put keeps a stream that just answered for the next renewal.
func (p *renewals) put(rs *renewStream) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prune(now)
	if len(p.idle) >= maxIdleRenewals || rs.expired(now) || p.ctx.Err() != nil {
		rs.cancel()
		return
	}
	p.idle = append(p.idle, rs)
}

// flush ends every idle stream.
func (p *renewals) flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, rs := range p.idle {
		rs.cancel()
	}
	clear(p.idle)
	p.idle = p.idle[:0]
}

// prune ends the idle streams opened renewStreamAge ago.
func (p *renewals) prune(now time.Time) {
	kept := p.idle[:0]
	for _, rs := range p.idle {
		if rs.expired(now) {
			rs.cancel()
			continue
		}
		kept = append(kept, rs)
	}
	clear(p.idle[len(kept):])
	p.idle = kept
}

// retryable reports whether another attempt of a renewal may succeed: the
// member had no leader, lost it, timed out waiting for it, or could not be
// reached.
func retryable(err error) bool {
	// A stream kept from before the client's auth token expired (or was
	// revoked) is refused; a new stream logs in again.
	if errors.Is(err, rpctypes.ErrInvalidAuthToken) || errors.Is(err, rpctypes.ErrAuthOldRevision) {
		return true
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Internal, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return errors.Is(err, context.DeadlineExceeded)
}

// Restore implements registry.Keeper: it makes sure that the key is
// registered under a live lease of ours, the current one if etcd still has
// it, else a new one.
func (k *keeper) Restore(ctx context.Context, inst registry.Instance) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	key := k.key
	old := k.lease()
	// Renewing once tells whether etcd still has the lease, and makes sure
	// it does for another TTL. (A lease that has expired but is not yet
	// revoked is not renewed: etcd answers once it is revoked.)
	ttl, sent, err := k.r.renew(ctx, old, k.r.s.attempt)
	switch {
	case err == nil:
		k.set(old, ttl, sent)
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
	granted := time.Now()
	reg, err := k.r.Create(ctx, inst, time.Duration(k.secs)*time.Second, CreateOptions{IfAbsent: true, Previous: old})
	if errors.Is(err, ErrHeld) {
		return registry.ErrTakenOver
	}
	if err != nil {
		return err
	}
	k.set(reg.Lease, reg.TTL, granted)
	k.r.s.outages.Mark(time.Now()) // etcd expired the lease: others too, perhaps
	k.r.s.log.Warn("lease was lost; registered under a new lease", "key", key, "old_lease", regid.Format(old), "lease", regid.Format(reg.Lease))
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
