package etcdstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/internal/testkit/picktest"
	"github.com/lanesdev/lanes/routing"
)

// TestClusterStallKeepsRouting pauses (SIGSTOP) a single etcd, and of a
// cluster of three the leader, two members (the quorum lost) and every
// member (the cluster stalled), for longer than the lease TTL, while a
// routing engine on its own Store picks an instance of a lane and of the
// baseline every 80ms: no pick fails, across the pause and after the
// resume. A leader elected when the members are back extends the leases,
// but a resumed etcd may expire some first (and a paused leader with
// etcd-io/etcd#15247, before 3.4.31 and 3.5.13: Debian's 3.4.23, all): the
// engine holds what the Store's outage tells it were expired by the stall,
// while the instances register again.
func TestClusterStallKeepsRouting(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name            string
		members, paused int
	}{{"single", 1, 1}, {"leader", 3, 1}, {"quorum", 3, 2}, {"all", 3, 3}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testClusterStall(t, c.members, c.paused)
		})
	}
}

func testClusterStall(t *testing.T, members, paused int) {
	c := etcdtest.NewCluster(t, etcdtest.ClusterConfig{Members: members})
	f := newFleet(t, c, 1, 1) // svc/i0, the baseline
	ctx := testCtx(t)
	lane := inst("svc", "l0", 9000)
	lane.Lane = "alice"
	l, err := f.reg.Register(ctx, lane, clusterTTL)
	if err != nil {
		t.Fatal(err)
	}
	f.leases["l0"] = l
	e := routing.New(routing.WithRegistry(f.open()), routing.WithLogger(testLogger))
	defer e.Close()
	svc := e.Service("svc")
	waitFor(t, "the engine to see both instances", func() bool { return len(svc.Instances()) == 2 })

	pickers := []*picktest.Picker{
		{Service: svc, Lane: "alice", Want: "l0", Every: 80 * time.Millisecond},
		{Service: svc, Want: "i0", Every: 80 * time.Millisecond},
	}
	pctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, p := range pickers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Run(pctx)
		}()
	}
	defer func() { stop(); wg.Wait() }()

	f.waitHealthy(ctx)
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	down := append([]*etcdtest.Member{leader}, c.Followers(leader)...)[:paused]
	start := time.Now()
	for _, m := range down {
		if err := m.Pause(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(clusterTTL + 4*time.Second) // the scenario: longer than the TTL
	for _, m := range down {
		if err := m.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	resumed := time.Now()
	// Every registration renewed (or made again) since the resume, and
	// every watcher seeing both instances; then ten more picks each.
	f.waitRenewed(resumed, 2*clusterTTL)
	f.seen(resumed, 2*clusterTTL, func(ids map[string]bool) bool { return ids["i0"] && ids["l0"] })
	var from []int
	for _, p := range pickers {
		n, _, _ := p.Counts()
		from = append(from, n)
	}
	waitFor(t, "ten picks after the recovery", func() bool {
		for i, p := range pickers {
			if n, _, _ := p.Counts(); n < from[i]+10 {
				return false
			}
		}
		return true
	})
	stop()
	wg.Wait()
	lost := f.lostSince(start)
	for _, p := range pickers {
		n, failed, fallback := p.Counts()
		t.Logf("%d of %d member(s) paused for %.1fs: lane %q: %d of %d picks failed, %d served by a fallback; registrations lost and made again: %v; held after: %v",
			paused, len(c.Members), resumed.Sub(start).Seconds(), p.Lane, len(failed), n, fallback, lost, e.Held("svc"))
		if len(failed) > 0 {
			t.Errorf("lane %q: %d picks failed: %v", p.Lane, len(failed), failed[:min(len(failed), 5)])
		}
	}
}
