package mqlane

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lanesdev/lanes/lane"
)

// A Run is one lane's consumption by a consumer, from the moment the
// consumer owns the lane until it has handed it on: a backend's body
// consumes while Poll is not done, handles with Handle (in the lane), and
// returns once it has settled what it received. Stop ends Poll at once and
// Handle after the drain timeout (at once when the consumer was aborted).
type Run struct {
	Lane string
	// Poll is cancelled to stop consuming; Handle, the handlers' context in
	// the lane, when draining times out.
	Poll, Handle context.Context

	unpoll, hstop context.CancelFunc
	prev          *Run
	done          chan struct{}
	drainTimeout  time.Duration
	aborted       *atomic.Bool

	mu     sync.Mutex
	want   bool
	drain  *time.Timer
	exited bool
}

// Stop makes the run stop consuming and hand on what it holds, within the
// drain timeout. It reports whether it was wanted.
func (r *Run) Stop() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	was := r.want
	r.want = false
	r.unpoll()
	if r.aborted.Load() {
		r.hstop()
	} else if r.drain == nil && !r.exited {
		r.drain = time.AfterFunc(r.drainTimeout, r.hstop)
	}
	return was
}

// Wanted reports whether the run has not been stopped.
func (r *Run) Wanted() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.want
}

// Aborted reports whether the consumer stops as a crash would: nothing
// more may be acknowledged.
func (r *Run) Aborted() bool { return r.aborted.Load() }

// Finished reports whether the run's body has returned.
func (r *Run) Finished() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// run waits for the lane's previous run, then runs body.
func (r *Run) run(body func(*Run)) {
	defer close(r.done)
	defer func() {
		r.mu.Lock()
		r.exited = true
		if r.drain != nil {
			r.drain.Stop()
		}
		r.mu.Unlock()
		r.hstop()
	}()
	if r.prev != nil {
		<-r.prev.done // order within the lane: the previous run settles first
		r.prev = nil
	}
	body(r)
}

// Runs are a consumer's runs, one per lane it owns.
type Runs struct {
	drain   time.Duration
	aborted atomic.Bool
	body    func(*Run)
	log     *slog.Logger
	name    func(l string) string // what a lane is at the broker, for logs

	mu     sync.Mutex
	runs   map[string]*Run
	closed bool
	err    error
}

// NewRuns returns the runs of a consumer: body consumes one lane; name says
// what a lane is at the broker (a topic, a queue), for the log.
func NewRuns(drain time.Duration, log *slog.Logger, name func(l string) string, body func(*Run)) *Runs {
	return &Runs{drain: drain, body: body, log: log, name: name, runs: map[string]*Run{}}
}

// Reconcile starts a run of each lane in want that has none, and stops the
// runs of the others. A lane taken back while its run stops gets a new run
// that starts once the old one has settled.
func (s *Runs) Reconcile(want map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	for l, r := range s.runs {
		if r.Finished() {
			delete(s.runs, l)
			continue
		}
		if !want[l] && r.Stop() {
			s.log.Info("lanes: lane released", "at", s.name(l))
		}
	}
	for l := range want {
		if r := s.runs[l]; r != nil && r.Wanted() {
			continue
		}
		r := &Run{Lane: l, prev: s.runs[l], done: make(chan struct{}), drainTimeout: s.drain, aborted: &s.aborted, want: true}
		r.Poll, r.unpoll = context.WithCancel(context.Background())
		r.Handle, r.hstop = context.WithCancel(lane.WithLane(context.Background(), l))
		s.runs[l] = r
		go r.run(s.body) // owned by s: Close waits for it
		s.log.Info("lanes: lane owned", "at", s.name(l))
	}
}

// Owned returns the lanes of the runs that consume, or still settle what
// they received after a stop, sorted: once a lane is not listed, nothing
// published in it later reaches this consumer until it owns it again.
func (s *Runs) Owned() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for l, r := range s.runs {
		if r.Wanted() || !r.Finished() {
			out = append(out, l)
		}
	}
	sort.Strings(out)
	return out
}

// Abort makes the runs stop as a crash would: no more acknowledgements,
// handlers' contexts cancelled at once.
func (s *Runs) Abort() { s.aborted.Store(true) }

// Aborted reports whether Abort was called.
func (s *Runs) Aborted() bool { return s.aborted.Load() }

// Close stops every run, waits for them, and refuses new ones.
func (s *Runs) Close() {
	s.mu.Lock()
	s.closed = true
	rs := make([]*Run, 0, len(s.runs))
	for _, r := range s.runs {
		rs = append(rs, r)
	}
	s.mu.Unlock()
	for _, r := range rs {
		r.Stop()
	}
	for _, r := range rs {
		<-r.done
	}
}

// SetErr records why the consumer stopped, the first time.
func (s *Runs) SetErr(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

// Err returns what SetErr recorded.
func (s *Runs) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Delay is the delay after failed attempt n of delays (the last repeats).
func Delay(delays []time.Duration, n int) time.Duration {
	if n < 1 {
		n = 1
	}
	if n > len(delays) {
		return delays[len(delays)-1]
	}
	return delays[n-1]
}

// Permanent marks an error that sends a message to the dead letters at
// once; the backends' Permanent wrap with it.
type Permanent struct{ Err error }

func (e *Permanent) Error() string { return "permanent: " + e.Err.Error() }
func (e *Permanent) Unwrap() error { return e.Err }

// IsPermanent reports whether err wraps a *Permanent.
func IsPermanent(err error) bool {
	var p *Permanent
	return errors.As(err, &p)
}
