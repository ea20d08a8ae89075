package routedcall_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/lib/routedcall"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

func TestClassify(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		a    routedcall.Attempt
		want routedcall.Outcome
	}{
		{"200", routedcall.Attempt{Status: 200}, routedcall.Success},
		{"421 from the guard", routedcall.Attempt{Status: 421, Downstream: true, Misdirected: true}, routedcall.Success},
		{"500", routedcall.Attempt{Status: 500}, routedcall.Failure},
		{"503 routing failure downstream", routedcall.Attempt{Status: 503, Downstream: true}, routedcall.Success},
		{"reset", routedcall.Attempt{Err: boom}, routedcall.Failure},
		{"refused", routedcall.Attempt{Err: boom, Unsent: true}, routedcall.Unreachable},
		{"caller gone", routedcall.Attempt{Err: boom, CallerGone: true}, routedcall.Ignore},
		{"caller gone while dialling", routedcall.Attempt{Err: boom, Unsent: true, CallerGone: true}, routedcall.Ignore},
	} {
		if got := routedcall.Classify(tc.a); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	for code, want := range map[uint32]routedcall.Outcome{0: routedcall.Success, 1: routedcall.Ignore, 2: routedcall.Success, 4: routedcall.Ignore, 13: routedcall.Success, 14: routedcall.Failure} {
		if got := routedcall.ClassifyGRPC(code); got != want {
			t.Errorf("gRPC code %d: %v, want %v", code, got, want)
		}
	}
}

func engine(t *testing.T, doc string, insts ...registry.Instance) *routing.Engine {
	t.Helper()
	e := routing.New()
	t.Cleanup(func() { e.Close() })
	p, err := policy.Parse("test", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	e.SetPolicy(p)
	e.SetInstances("orders", insts)
	return e
}

// TestUnreachableMovesOn: an Unreachable ejects the instance at once and the
// call moves on, without spending the retry budget, along the fallback
// chain.
func TestUnreachableMovesOn(t *testing.T) {
	e := engine(t, "outlier: {errors: 5}\n",
		registry.Instance{ID: "a1", Service: "orders", Addr: "a1:1", Lane: "alice"},
		registry.Instance{ID: "b1", Service: "orders", Addr: "b1:1"})
	var c routedcall.Call
	p, err := c.Start(context.Background(), e.Service("orders"), routing.Request{Lane: "alice"}, 0, time.Second)
	if err != nil || p.Instance.ID != "a1" {
		t.Fatalf("first pick %v %v", p.Instance, err)
	}
	if !c.Again(routedcall.Unreachable, false, true) {
		t.Fatal("no move past an unreachable instance")
	}
	p, ok := c.Next()
	if !ok || p.Instance.ID != "b1" || p.Reason != routing.ReasonLaneEmpty {
		t.Fatalf("next pick %v %v %v, want b1 by the fallback to the baseline", p.Instance, p.Reason, ok)
	}
	// No retry budget: a failure ends the call.
	if c.Again(routedcall.Failure, true, true) {
		t.Fatal("a failure was retried with no budget")
	}
	if !c.Retried() {
		t.Fatal("Retried: false after a move")
	}
}

// TestLateAbandonCounts: an Ignore for an attempt that the caller abandoned
// after the response-header timeout is a failure; before it, nothing.
func TestLateAbandonCounts(t *testing.T) {
	e := engine(t, "outlier: {errors: 1}\n", registry.Instance{ID: "b1", Service: "orders", Addr: "b1:1"},
		registry.Instance{ID: "b2", Service: "orders", Addr: "b2:1"})
	svc := e.Service("orders")
	abandoned := func(timeout time.Duration) string {
		ctx, cancel := context.WithCancel(context.Background())
		var c routedcall.Call
		p, err := c.Start(ctx, svc, routing.Request{}, 1, timeout)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond) // the attempt takes longer than a 1ns timeout
		cancel()
		if c.Again(routedcall.Ignore, true, true) {
			t.Fatal("retried after the caller gave up")
		}
		return p.Instance.ID
	}
	abandoned(time.Hour)
	if d, _ := svc.Resolve(routing.Request{}); len(d.Eligible) != 2 {
		t.Fatalf("eligible %v after an early abandon, want both", d.Eligible)
	}
	id := abandoned(time.Nanosecond)
	if d, _ := svc.Resolve(routing.Request{}); len(d.Eligible) != 1 || d.Eligible[0] == id {
		t.Fatalf("eligible %v after a late abandon of %s, want it ejected", d.Eligible, id)
	}
}

// TestTimeout: a timeout setting of 0 is the default, a negative one none.
func TestTimeout(t *testing.T) {
	for _, tc := range []struct{ d, want time.Duration }{
		{0, 7 * time.Second},
		{-1, 0},
		{-time.Hour, 0},
		{time.Millisecond, time.Millisecond},
	} {
		if got := routedcall.Timeout(tc.d, 7*time.Second); got != tc.want {
			t.Errorf("Timeout(%v, 7s) = %v, want %v", tc.d, got, tc.want)
		}
	}
	if got := routedcall.HeaderTimeout(0); got != routedcall.DefaultResponseHeaderTimeout {
		t.Errorf("HeaderTimeout(0) = %v, want %v", got, routedcall.DefaultResponseHeaderTimeout)
	}
}

// TestFailureFollowsTheChain: once every instance of the lane failed the
// call, its retry follows the lane chain (for this call only); a strict lane
// gets no retry.
func TestFailureFollowsTheChain(t *testing.T) {
	e := engine(t, "outlier: {errors: 5}\nlanes:\n  alice: {fallback: [team-a]}\n  solo: {strict: true}\n",
		registry.Instance{ID: "a1", Service: "orders", Addr: "a1:1", Lane: "alice"},
		registry.Instance{ID: "a2", Service: "orders", Addr: "a2:1", Lane: "alice"},
		registry.Instance{ID: "t1", Service: "orders", Addr: "t1:1", Lane: "team-a"},
		registry.Instance{ID: "s1", Service: "orders", Addr: "s1:1", Lane: "solo"},
		registry.Instance{ID: "b1", Service: "orders", Addr: "b1:1"})
	svc := e.Service("orders")
	var c routedcall.Call
	p, err := c.Start(context.Background(), svc, routing.Request{Lane: "alice"}, 3, time.Second)
	if err != nil || p.Lane != "alice" {
		t.Fatalf("first pick %v %v", p.Instance, err)
	}
	var got []string
	for c.Again(routedcall.Failure, true, true) {
		p, ok := c.Next()
		if !ok {
			t.Fatalf("no retry after %v", got)
		}
		got = append(got, p.Instance.ID+"/"+p.Reason.String())
	}
	other := map[string]string{"a1": "a2", "a2": "a1"}[p.Instance.ID]
	if want := []string{other + "/lane", "t1/failover", "b1/failover"}; !slices.Equal(got, want) {
		t.Fatalf("retries %v, want %v", got, want)
	}
	// The lane is not ejected: the next call starts in it again.
	if p, err := svc.Pick(routing.Request{Lane: "alice"}); err != nil || p.Lane != "alice" {
		t.Fatalf("next call's pick %v in %q, %v; want alice", p.Instance, p.Lane, err)
	}

	if _, err := c.Start(context.Background(), svc, routing.Request{Lane: "solo"}, 3, time.Second); err != nil {
		t.Fatal(err)
	}
	if !c.Again(routedcall.Failure, true, true) {
		t.Fatal("no retry allowed")
	}
	if p, ok := c.Next(); ok {
		t.Fatalf("strict lane retried on %s in %q", p.Instance.ID, p.Lane)
	}
}
