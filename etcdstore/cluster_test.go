package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/registry"
)

// The cluster tests run a workload on a three-member etcd cluster (Debian's
// etcd, processes) through one Store that registers instances and others
// that watch them, as services do, while a member fails. They count what the
// issue of running on a cluster is about: registrations lost (an instance
// that a watcher stopped seeing although its lease was never closed),
// changes not seen, and how long every watcher took to see a change made
// during the failure.

// clusterTTL is the TTL of the registrations, long enough that an election
// on a loaded machine (the race detector, parallel packages) does not outlast
// it: etcd's minimum with its
// default election timeout is 2s; the keep-alives go every TTL/3.
const clusterTTL = 10 * time.Second

// fleet is the workload: registered instances and watchers on their own
// Stores (their own etcd clients).
type fleet struct {
	t        *testing.T
	c        *etcdtest.Cluster
	prefix   string
	reg      *etcdstore.Store
	leases   map[string]registry.Lease
	watchers []*follower
}

// follower follows every instance of a Store, as a service's engine does,
// and counts the instances it stopped seeing although they stayed
// registered.
type follower struct {
	w registry.Watcher

	mu      sync.Mutex
	st      registry.State
	keep    map[string]bool // ids that must never vanish
	lost    []string
	changed chan struct{} // signalled after each batch
	done    chan struct{}
}

func newFleet(t *testing.T, c *etcdtest.Cluster, instances, watchers int) *fleet {
	t.Helper()
	f := &fleet{t: t, c: c, prefix: uniquePrefix(), leases: map[string]registry.Lease{}}
	f.reg = f.open()
	ctx := testCtx(t)
	for i := range instances {
		id := fmt.Sprintf("i%d", i)
		l, err := f.reg.Register(ctx, inst("svc", id, 8000+i), clusterTTL)
		if err != nil {
			t.Fatal(err)
		}
		f.leases[id] = l
	}
	for range watchers {
		s := f.open()
		w, err := s.Watch(ctx, "svc")
		if err != nil {
			t.Fatal(err)
		}
		fl := &follower{w: w, keep: map[string]bool{}, changed: make(chan struct{}, 1), done: make(chan struct{})}
		for id := range f.leases {
			fl.keep[id] = true
		}
		go fl.run()
		t.Cleanup(func() { w.Close(); <-fl.done })
		f.watchers = append(f.watchers, fl)
	}
	// Every watcher sees every instance before the failure.
	for _, fl := range f.watchers {
		fl.waitFor(t, 10*time.Second, func(ids map[string]bool) bool { return len(ids) == instances })
	}
	return f
}

func (f *fleet) open() *etcdstore.Store {
	s, err := etcdstore.Open(testCtx(f.t), etcdstore.Config{
		Endpoints: f.c.Endpoints(),
		Options:   etcdstore.Options{Prefix: f.prefix, Logger: testLogger},
	})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { s.Close() })
	return s
}

func (fl *follower) run() {
	defer close(fl.done)
	for {
		b, err := fl.w.Next(context.Background())
		if err != nil {
			return
		}
		fl.mu.Lock()
		fl.st.Apply(b)
		ids := fl.idsLocked()
		for id := range fl.keep {
			if !ids[id] {
				fl.lost = append(fl.lost, id)
				delete(fl.keep, id) // count each once
			}
		}
		fl.mu.Unlock()
		select {
		case fl.changed <- struct{}{}:
		default:
		}
	}
}

func (fl *follower) idsLocked() map[string]bool {
	ids := map[string]bool{}
	for _, in := range fl.st.Instances("svc") {
		ids[in.ID] = true
	}
	return ids
}

// waitFor waits until cond holds for the instances the follower sees.
func (fl *follower) waitFor(t *testing.T, d time.Duration, cond func(ids map[string]bool) bool) {
	t.Helper()
	deadline := time.After(d)
	for {
		fl.mu.Lock()
		ok := cond(fl.idsLocked())
		fl.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-fl.changed:
		case <-deadline:
			fl.mu.Lock()
			defer fl.mu.Unlock()
			t.Fatalf("a watcher did not see the change within %s; it sees %v", d, fl.idsLocked())
		}
	}
}

// lost returns the instances that some watcher stopped seeing.
func (f *fleet) lost() []string {
	var out []string
	for _, fl := range f.watchers {
		fl.mu.Lock()
		out = append(out, fl.lost...)
		fl.mu.Unlock()
	}
	return out
}

// change registers instance id during a failure, retrying a failed call
// every 100ms as a service would, and returns how many calls failed.
func (f *fleet) register(ctx context.Context, id string) (failed int) {
	for {
		l, err := f.reg.Register(ctx, inst("svc", id, 9000), clusterTTL)
		if err == nil {
			f.leases[id] = l
			return failed
		}
		failed++
		f.t.Logf("register %s: %v", id, err)
		select {
		case <-ctx.Done():
			f.t.Fatalf("register %s: %v", id, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// end closes the lease of id, which watchers may then stop seeing.
func (f *fleet) end(id string) {
	for _, fl := range f.watchers {
		fl.mu.Lock()
		delete(fl.keep, id)
		fl.mu.Unlock()
	}
	if err := f.leases[id].Close(); err != nil {
		f.t.Logf("deregister %s: %v", id, err)
	}
	delete(f.leases, id)
}

// seen waits until every watcher sees cond, and returns how long that took
// since start.
func (f *fleet) seen(start time.Time, d time.Duration, cond func(map[string]bool) bool) time.Duration {
	f.t.Helper()
	for _, fl := range f.watchers {
		fl.waitFor(f.t, d, cond)
	}
	return time.Since(start)
}

// TestClusterLeaderKilled kills the etcd leader with SIGKILL while
// instances keep their leases and watchers follow them, and registers an
// instance and ends another during the election: no registration is lost,
// and every watcher sees both changes.
func TestClusterLeaderKilled(t *testing.T) {
	t.Parallel()
	c := etcdtest.NewCluster(t, etcdtest.ClusterConfig{})
	f := newFleet(t, c, 3, 3)
	ctx := testCtx(t)
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := leader.Kill(); err != nil {
		t.Fatal(err)
	}
	failed := f.register(ctx, "new")
	t.Logf("registered after %s", time.Since(start))
	f.end("i0")
	t.Logf("deregistered after %s", time.Since(start))
	took := f.seen(start, 20*time.Second, func(ids map[string]bool) bool { return ids["new"] && !ids["i0"] })
	if _, err := c.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	// A TTL after the kill, every registration is still there.
	time.Sleep(time.Until(start.Add(clusterTTL + 2*time.Second)))
	if lost := f.lost(); len(lost) > 0 {
		t.Fatalf("registrations lost: %v", lost)
	}
	t.Logf("etcd leader %s killed: registrations lost 0, failed register calls %d, every watcher saw the changes after %.2fs", leader.Name, failed, took.Seconds())
}

// TestClusterMemberPaused pauses the etcd leader (SIGSTOP) for longer than
// the lease TTL, then resumes it: the Store's clients move off the paused
// member, so no registration is lost, and a registration ended during the
// pause vanishes from every watcher while the member is still paused (no
// stale instance). Then the same for a follower.
func TestClusterMemberPaused(t *testing.T) {
	t.Parallel()
	c := etcdtest.NewCluster(t, etcdtest.ClusterConfig{})
	f := newFleet(t, c, 3, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for round, role := range []string{"leader", "follower"} {
		m, err := c.WaitLeader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if role == "follower" {
			m = c.Followers(m)[0]
		}
		start := time.Now()
		if err := m.Pause(); err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("i%d", round)
		f.end(id)
		t.Logf("deregistered %s %.2fs after the pause", id, time.Since(start).Seconds())
		// While the member is still paused: no stale instance. (Ending a
		// registration is bounded by registry.ReleaseTimeout, 5s.)
		pause := clusterTTL + 4*time.Second
		took := f.seen(start, pause-time.Second, func(ids map[string]bool) bool { return !ids[id] })
		// Stay paused for longer than the TTL after the last keep-alive
		// the member could have taken.
		time.Sleep(time.Until(start.Add(pause)))
		if err := m.Resume(); err != nil {
			t.Fatal(err)
		}
		h, _ := f.reg.Health()
		if lost := f.lost(); len(lost) > 0 {
			t.Fatalf("registrations lost while %s was paused: %v (health %+v)", m.Name, lost, h)
		}
		t.Logf("etcd %s %s paused for %.1fs: registrations lost 0; every watcher saw the deregistration after %.2fs", role, m.Name, time.Since(start).Seconds(), took.Seconds())
	}
}

// TestClusterQuorumLost stops two of three members: watchers keep what they
// saw, registrations fail at once with ErrNoQuorum, Health says so; when
// the members are back, everything recovers by itself.
func TestClusterQuorumLost(t *testing.T) {
	t.Parallel()
	c := etcdtest.NewCluster(t, etcdtest.ClusterConfig{})
	f := newFleet(t, c, 3, 2)
	ctx := testCtx(t)
	down := c.Members[:2]
	for _, m := range down {
		if err := m.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	// Requests fail at once once the quorum timeout has passed.
	deadline := time.Now().Add(etcdstore.DefaultQuorumTimeout + 10*time.Second)
	var err error
	for time.Now().Before(deadline) {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		start := time.Now()
		_, err = f.reg.Register(rctx, inst("svc", "late", 9000), clusterTTL)
		cancel()
		if errors.Is(err, etcdstore.ErrNoQuorum) {
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("refusal took %s", d)
			}
			break
		}
		if err == nil {
			t.Fatal("registered without a quorum")
		}
	}
	if !errors.Is(err, etcdstore.ErrNoQuorum) {
		t.Fatalf("register without a quorum: %v; want ErrNoQuorum", err)
	}
	t.Logf("refused: %v", err)
	if h, _ := f.reg.Health(); h.State != etcdstore.HealthNoQuorum {
		t.Fatalf("health without a quorum: %+v", h)
	}
	for _, fl := range f.watchers {
		fl.mu.Lock()
		n := len(fl.idsLocked())
		fl.mu.Unlock()
		if n != 3 {
			t.Fatalf("a watcher sees %d instances without a quorum; want the 3 it saw", n)
		}
	}
	if err := c.StartAll(); err != nil { // each waits for the other
		t.Fatal(err)
	}
	if _, err := c.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		_, err = f.reg.Register(ctx, inst("svc", "late", 9000), clusterTTL)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("register after the quorum is back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	f.seen(time.Now(), 15*time.Second, func(ids map[string]bool) bool { return ids["late"] && len(ids) == 4 })
	if lost := f.lost(); len(lost) > 0 {
		t.Fatalf("registrations lost over the quorum loss: %v", lost)
	}
}

// TestHealthDeadEndpoint opens a Store on a live member and an address where
// nothing listens: Health says degraded and avoids the dead one, and the
// Store works on the live one.
func TestHealthDeadEndpoint(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Embedded(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	s, err := etcdstore.Open(testCtx(t), etcdstore.Config{
		Endpoints: append(srv.Endpoints(), dead),
		Options:   etcdstore.Options{Prefix: uniquePrefix(), Logger: testLogger},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		h, ok := s.Health()
		if !ok {
			t.Fatal("no health from a Store of Open")
		}
		if h.State == etcdstore.HealthDegraded && h.Members[0].State == etcdstore.MemberUp && h.Members[1].State == etcdstore.MemberDown && h.Members[1].Avoided {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health with a dead endpoint: %+v", h)
		}
		time.Sleep(20 * time.Millisecond)
	}
	l, err := s.Register(testCtx(t), inst("svc", "a", 1), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	off, err := etcdstore.Open(testCtx(t), etcdstore.Config{Endpoints: srv.Endpoints(), MemberTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer off.Close()
	if _, ok := off.Health(); ok {
		t.Error("health with the checks off")
	}
}
