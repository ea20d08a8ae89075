package routing

import (
	"sync"
	"testing"
	"time"
)

// patience bounds waits for an engine goroutine; generous for a loaded
// machine under -race. The tests measure nothing.
const patience = 30 * time.Second

// pickWithin picks in a goroutine and fails the test unless the pick returns
// while the test holds the service's mutex (a rebuild in progress).
func pickWithin(t *testing.T, s *Service, req Request, failed ...string) (Result, error) {
	t.Helper()
	type answer struct {
		r   Result
		err error
	}
	done := make(chan answer, 1)
	go func() {
		r, err := s.PickWithout(req, failed...) // Pick when none failed
		done <- answer{r, err}
	}()
	select {
	case a := <-done:
		return a.r, a.err
	case <-time.After(patience):
		t.Fatal("the pick waited for the rebuild")
		return Result{}, nil
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A pick that finds a transition due, or claims a probe, answers at once
// from the snapshot it holds; an engine goroutine publishes the next one.
func TestPickDoesNotWaitForRebuild(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 1, window: 10s, ejection: 10s}\n",
		"b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080")
	s := f.e.Service("orders")
	s.ReportID("b1", false)
	f.at(11 * time.Second) // b1's ejection is over: its probe is due
	before := s.snap.Load()

	s.mu.Lock() // a rebuild in progress, for as long as the test says
	r, err := pickWithin(t, s, Request{})
	if err != nil || r.Instance.ID != "b1" || !r.Probe() {
		s.mu.Unlock()
		t.Fatalf("picked %+v, %v; want b1's probe", r, err)
	}
	for range 10 {
		// b1's probe is in flight: not eligible, although the snapshot
		// in force was built while it was ejected.
		if r, err := pickWithin(t, s, Request{}); err != nil || r.Instance.ID != "b2" {
			s.mu.Unlock()
			t.Fatalf("picked %+v, %v during the probe; want b2", r, err)
		}
	}
	if s.snap.Load() != before {
		t.Error("a snapshot was published while a rebuild held the mutex")
	}
	s.mu.Unlock()
	waitUntil(t, "the snapshot with b1's probe in flight", func() bool {
		m := s.snap.Load().member("b1")
		return m != nil && m.state == stateProbing
	})
	r.Report(true)
	f.expect("orders", Request{}, []string{"b1", "b2"}, "")
}

// When every instance of the serving lane is half-open and another request
// claimed its probe first, a pick goes where the next snapshot will send it:
// along the chain, to the baseline in panic mode, out of a canary split.
func TestPickPastClaimedProbes(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 1, window: 10s, ejection: 10s}\nlanes:\n  alice: {fallback: [team-a]}\ncanary:\n  - {service: orders, lane: canary, percent: 100}\n",
		"b1 orders 10.0.0.1:8080", "a1 orders 10.0.9.1:8080 lane=alice", "t1 orders 10.0.8.1:8080 lane=team-a",
		"k1 orders 10.0.7.1:8080 lane=canary", "p1 payments 10.0.0.5:8080")
	orders, payments := f.e.Service("orders"), f.e.Service("payments")
	for _, id := range []string{"a1", "k1"} {
		orders.ReportID(id, false)
	}
	payments.ReportID("p1", false)
	f.at(11 * time.Second)
	orders.current() // brings the snapshots up to date: a1, k1 and p1 half-open
	payments.current()

	orders.mu.Lock()
	payments.mu.Lock()
	defer orders.mu.Unlock()
	defer payments.mu.Unlock()
	check := func(s *Service, req Request, id, servingLane, requestLane string, reason Reason) {
		t.Helper()
		r, err := pickWithin(t, s, req)
		if err != nil || r.Instance.ID != id || r.Lane != servingLane || r.RequestLane != requestLane || r.Reason != reason {
			t.Fatalf("Pick(%+v) = %s in %q carrying %q (%s), %v; want %s in %q carrying %q (%s)",
				req, r.Instance.ID, r.Lane, r.RequestLane, r.Reason, err, id, servingLane, requestLane, reason)
		}
	}
	check(orders, Request{Lane: "alice"}, "a1", "alice", "alice", ReasonProbe)
	check(orders, Request{Lane: "alice"}, "t1", "team-a", "alice", ReasonFallback)
	check(orders, Request{Key: "u"}, "k1", "canary", "canary", ReasonProbe)
	check(orders, Request{Key: "u"}, "b1", "", "", ReasonBaseline)
	check(payments, Request{}, "p1", "", "", ReasonProbe)
	// The baseline's only instance is probing: panic mode keeps it
	// eligible, as the next snapshot will.
	check(payments, Request{}, "p1", "", "", ReasonPanic)
}

// A time-driven change that is not a probe (a lane expiring) is published
// by an engine goroutine after the first pick that finds it due.
func TestDueLaneExpiryIsPublished(t *testing.T) {
	f := newFixture(t, "lanes:\n  alice: {expires: 2023-11-14T22:13:30Z}\n", // 10s after the fixture's start
		"b1 orders 10.0.0.1:8080", "a1 orders 10.0.9.1:8080 lane=alice")
	s := f.e.Service("orders")
	if r, _ := s.Pick(Request{Lane: "alice"}); r.Instance.ID != "a1" {
		t.Fatalf("picked %s before the expiry, want a1", r.Instance.ID)
	}
	f.at(10 * time.Second)
	s.Pick(Request{Lane: "alice"})
	waitUntil(t, "the expiry", func() bool {
		r, _ := s.Pick(Request{Lane: "alice"})
		return r.Instance.ID == "b1"
	})
}

// Picks, reports, probes and rebuilds at once: run with -race.
func TestConcurrentPicksAndRebuilds(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 2, window: 10s, ejection: 1s}\n",
		"b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080", "b3 orders 10.0.0.3:8080 lane=alice")
	s := f.e.Service("orders")
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				req := Request{}
				if i%2 == 0 {
					req.Lane = "alice"
				}
				r, err := s.Pick(req)
				if err != nil {
					t.Error(err)
					return
				}
				r.Report((i+w)%5 != 0)
			}
		}()
	}
	for i := range 200 {
		f.at(time.Duration(i) * 100 * time.Millisecond)
		if i%50 == 0 {
			f.e.SetPolicy(mustPolicy(t, "outlier: {errors: 2, window: 10s, ejection: 1s}\n"))
		}
	}
	wg.Wait()
}

// The pick of a retry (PickWithout) does not wait for a rebuild either: it
// finds the transition due, and probes the instance whose ejection ended.
func TestRetryPickDoesNotWaitForRebuild(t *testing.T) {
	f := newFixture(t, "outlier: {errors: 1, window: 10s, ejection: 10s}\n",
		"b1 orders 10.0.0.1:8080", "b2 orders 10.0.0.2:8080", "b3 orders 10.0.0.3:8080")
	s := f.e.Service("orders")
	s.ReportID("b1", false)
	f.at(11 * time.Second) // b1's ejection is over: its probe is due
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := pickWithin(t, s, Request{}, "b2")
	if err != nil || r.Instance.ID != "b1" || !r.Probe() {
		t.Fatalf("retry picked %+v, %v; want b1's probe", r, err)
	}
	if r, err := pickWithin(t, s, Request{}, "b2"); err != nil || r.Instance.ID != "b3" {
		t.Fatalf("retry picked %+v, %v during b1's probe with b2 failed; want b3", r, err)
	}
}
