package etcdstore_test

import (
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/internal/testkit/timing"
	"github.com/lanesdev/lanes/routing"
)

// TestRoutingEngine runs the routing engine on a Store, as lanes does: the
// engine watches the services it is asked about and follows the policy.
func TestRoutingEngine(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		ctx := testCtx(t)
		s := open(t, srv)
		l, err := s.Register(ctx, inst("orders", "b1", 1), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		e := routing.New(routing.WithRegistry(s), routing.WithPolicyStore(s.Policy()), routing.WithLogger(testLogger))
		defer e.Close()

		svc := e.Service("orders")
		if err := svc.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		if got := svc.Instances(); len(got) != 1 || got[0].ID != "b1" {
			t.Fatalf("engine has %+v", got)
		}
		select {
		case <-e.PolicyReady():
		case <-ctx.Done():
			t.Fatal("policy never ready")
		}
		t2 := inst("orders", "t1", 2)
		t2.Lane = "team-a"
		l2, err := s.Register(ctx, t2, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer l2.Close()
		if _, err := s.Policy().Put(ctx, []byte("lanes:\n  alice: {fallback: [team-a]}\n")); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the engine to see t1 and the policy", func() bool {
			return len(svc.Instances()) == 2 && len(e.Policy().Lanes["alice"].Fallback) == 1
		})
		l2.Close()
		waitFor(t, "the engine to drop t1", func() bool { return len(svc.Instances()) == 1 })
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	timing.Until(t, what, 10*time.Second, cond)
}
