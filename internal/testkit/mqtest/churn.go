package mqtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/lanesdev/lanes/lane"
)

// ChurnConfig sets the workload of Churn.
type ChurnConfig struct {
	// PerLane is the number of messages published in the baseline and in
	// each of the three lanes.
	PerLane int
	// Publish is how long publishing takes (the producers are paced).
	Publish time.Duration
	// Seed seeds the consumers' schedule.
	Seed uint64
	// Fault, when set, runs while the producers publish (a broker restart):
	// it returns when stop is closed or it is done.
	Fault func(t *testing.T, stop <-chan struct{})
}

// ChurnResult is what Churn measured.
type ChurnResult struct {
	Published, Handled, Lost, Duplicates int
	// Kills and Stops count the lane consumers killed and stopped.
	Kills, Stops int
	// LongestWait is the longest time from a message's publish to its first
	// handling: the longest hand-off, since the churn is what makes a
	// message wait.
	LongestWait time.Duration
	// PublishTook is how long publishing took.
	PublishTook time.Duration
}

func (r ChurnResult) String() string {
	return fmt.Sprintf("published %d, handled %d, lost %d, duplicates %d, lane consumers killed %d and stopped %d, longest hand-off %v, publishing took %v",
		r.Published, r.Handled, r.Lost, r.Duplicates, r.Kills, r.Stops, r.LongestWait.Round(time.Millisecond), r.PublishTook.Round(time.Millisecond))
}

// churnLanes are the lanes of Churn besides the baseline.
var churnLanes = []string{"l1", "l2", "l3"}

// Churn publishes cfg.PerLane messages in the baseline and in each of three
// lanes while the lanes' consumers are started, stopped gracefully and
// killed at random (seeded) times, and a baseline consumer runs throughout.
// It checks that every message was handled, in its lane, by a consumer of
// its lane or by the baseline, that no baseline message reached a lane
// consumer, and that duplicates follow kills only; it returns the figures.
func Churn(t *testing.T, newBackend NewBackend, cfg ChurnConfig) ChurnResult {
	s := newSuite(t)
	s.b = newBackend(t, s.env)
	published := make(map[string]time.Time, 4*cfg.PerLane)
	var pubMu sync.Mutex
	s.start("base-0", "", nil)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var res ChurnResult
	var resMu sync.Mutex
	// The lane consumers' schedule: up for 0.5-2s, then stopped or killed,
	// down for 0.2-1s.
	for i, l := range churnLanes {
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(i)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				c, err := s.tryStart(fmt.Sprintf("%s-%d", l, n), l, nil)
				if err != nil {
					// The broker is restarting: try again.
					if stopped(stop, 200*time.Millisecond) {
						return
					}
					continue
				}
				up := stopped(stop, time.Duration(500+rng.IntN(1500))*time.Millisecond)
				kill := rng.IntN(2) == 0
				if kill {
					resMu.Lock()
					res.Kills++
					resMu.Unlock()
					c.Kill()
				} else {
					resMu.Lock()
					res.Stops++
					resMu.Unlock()
					c.Stop()
				}
				if up || stopped(stop, time.Duration(200+rng.IntN(800))*time.Millisecond) {
					return
				}
			}
		}()
	}
	faultDone := make(chan struct{})
	go func() {
		defer close(faultDone)
		if cfg.Fault != nil {
			cfg.Fault(t, stop)
		}
	}()

	// The producers: one per lane and the baseline, paced over cfg.Publish;
	// a failed publish is tried again with the same id.
	start := time.Now()
	var pwg sync.WaitGroup
	errs := make(chan error, 4)
	for _, l := range append([]string{""}, churnLanes...) {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			ctx := lane.WithLane(context.Background(), l)
			name := l
			if name == "" {
				name = "base"
			}
			for i := range cfg.PerLane {
				if due := start.Add(cfg.Publish * time.Duration(i) / time.Duration(cfg.PerLane)); time.Until(due) > 0 {
					time.Sleep(time.Until(due)) // pacing the load, not waiting for an event
				}
				id := fmt.Sprintf("%s-%d", name, i)
				at := time.Now()
				for attempt := 0; ; attempt++ {
					pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					err := s.b.Publish(pctx, id)
					cancel()
					if err == nil {
						break
					}
					if time.Since(at) > 2*time.Minute {
						errs <- fmt.Errorf("publish %s: %w", id, err)
						return
					}
					time.Sleep(100 * time.Millisecond) // the broker is restarting
				}
				pubMu.Lock()
				published[id] = at
				pubMu.Unlock()
			}
		}()
	}
	pwg.Wait()
	res.PublishTook = time.Since(start)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	close(stop)
	wg.Wait()
	<-faultDone

	ids := make([]string, 0, len(published))
	for id := range published {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	s.waitAll(ids, 3*time.Minute)

	s.mu.Lock()
	defer s.mu.Unlock()
	res.Published = len(published)
	for _, id := range ids {
		gs := s.handled[id]
		if len(gs) == 0 {
			res.Lost++
			continue
		}
		res.Handled++
		res.Duplicates += len(gs) - 1
		msgLane := laneOfID(id)
		for _, g := range gs {
			if g.Lane != msgLane || g.CtxLane != msgLane {
				t.Errorf("message %s of lane %q delivered in lane %q, handler context in %q", id, msgLane, g.Lane, g.CtxLane)
			}
			if g.by.Lane != "" && g.by.Lane != msgLane {
				t.Errorf("message %s of lane %q handled by %s of lane %q", id, msgLane, g.by.ID, g.by.Lane)
			}
		}
		if w := gs[0].at.Sub(published[id]); w > res.LongestWait {
			res.LongestWait = w
		}
	}
	if res.Lost > 0 {
		t.Errorf("%d messages lost", res.Lost)
	}
	if res.Duplicates > 0 && res.Kills == 0 && cfg.Fault == nil {
		t.Errorf("%d duplicates without a kill", res.Duplicates)
	}
	return res
}

// laneOfID is the lane of a Churn message id, "<lane or base>-<n>".
func laneOfID(id string) string {
	for _, l := range churnLanes {
		if len(id) > len(l) && id[:len(l)+1] == l+"-" {
			return l
		}
	}
	return ""
}

// waitAll waits until every id is handled, or the timeout.
func (s *suite) waitAll(ids []string, timeout time.Duration) {
	deadline := time.After(timeout)
	for {
		s.mu.Lock()
		missing := 0
		for _, id := range ids {
			if len(s.handled[id]) == 0 {
				missing++
			}
		}
		s.mu.Unlock()
		if missing == 0 {
			return
		}
		select {
		case <-s.changed:
		case <-deadline:
			s.t.Errorf("%d of %d messages not handled after %v", missing, len(ids), timeout)
			return
		}
	}
}

// stopped waits d, or less when stop is closed, and reports whether it is.
func stopped(stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-stop:
		return true
	case <-t.C:
		return false
	}
}
