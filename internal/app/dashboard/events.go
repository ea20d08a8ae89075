package dashboard

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/lanesdev/lanes/internal/lib/backoff"
)

// events streams server-sent events to a page: "instances" when an
// instance comes, changes or goes, "policy" when the policy changes,
// "findings" when a new integrity finding arrives. The page then reloads
// its live parts (assets/app.js).
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	sess, ok := s.session(r)
	if !ok {
		http.Error(w, "log in first", http.StatusUnauthorized)
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		http.Error(w, "the dashboard is shutting down", http.StatusServiceUnavailable)
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()

	ctx, cancel := context.WithCancel(withRemoteAddr(r.Context(), r.RemoteAddr))
	defer cancel()
	stop := context.AfterFunc(s.streams, cancel)
	defer stop()
	c := s.client(sess.token)
	ch := make(chan string, 16)
	send := func(kind string) {
		select {
		case ch <- kind:
		default: // a burst: the page reloads once anyway
		}
	}
	// ready counts the watches that hold their first state: the stream
	// opens (and the page refreshes itself, assets/app.js) only after both
	// do, so a change made once the page sees the stream open is never
	// taken for the state the page already shows.
	ready := make(chan struct{}, 2)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(3)
	go func() {
		defer wg.Done()
		follow(ctx, func(ctx context.Context) (func() error, io.Closer, error) {
			st, err := c.WatchInstances(ctx, "")
			if err != nil {
				return nil, nil, err
			}
			return func() error { _, err := st.Next(); return err }, st, nil
		}, func() { ready <- struct{}{} }, func() { send("instances") })
	}()
	go func() {
		defer wg.Done()
		follow(ctx, func(ctx context.Context) (func() error, io.Closer, error) {
			st, err := c.WatchPolicy(ctx)
			if err != nil {
				return nil, nil, err
			}
			return func() error { _, err := st.Next(); return err }, st, nil
		}, func() { ready <- struct{}{} }, func() { send("policy") })
	}()
	go func() { // findings: the collector has no watch; poll it
		defer wg.Done()
		var last time.Time
		t := time.NewTicker(s.cfg.FindingsPoll)
		defer t.Stop()
		for {
			fs, err := c.Findings(ctx, time.Hour, "")
			if err == nil && len(fs) > 0 {
				if !last.IsZero() && fs[0].At.After(last) {
					send("findings")
				}
				last = fs[0].At
			} else if err == nil && last.IsZero() {
				last = time.Unix(0, 0)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()

	// A watch that cannot open (the admin API down) holds the stream back
	// at most readyWait; its changes then show once it opens.
	wait := time.NewTimer(readyWait)
	defer wait.Stop()
waitReady:
	for n := 0; n < 2; n++ {
		select {
		case <-ready:
		case <-wait.C:
			break waitReady
		case <-ctx.Done():
			return
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	fmt.Fprint(w, "retry: 2000\n\n")
	if rc.Flush() != nil {
		return
	}
	keep := time.NewTicker(20 * time.Second)
	defer keep.Stop()
	for {
		var msg string
		select {
		case <-ctx.Done():
			return
		case kind := <-ch:
			msg = "event: " + kind + "\ndata: " + kind + "\n\n"
		case <-keep.C:
			msg = ": keep-alive\n\n"
		}
		if _, err := fmt.Fprint(w, msg); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
	}
}

// readyWait bounds how long the event stream waits for its watches' first
// state before it opens anyway.
const readyWait = 10 * time.Second

// follow keeps a watch open until ctx is done, reopening it after a
// capped, jittered delay. The first item of the first stream is the state
// the page refreshes to when the event stream opens: follow calls ready
// then. It calls changed on every later item, and on the first item of a
// reopened stream (what changed while it was closed is not known).
func follow(ctx context.Context, open func(context.Context) (next func() error, _ io.Closer, _ error), ready, changed func()) {
	b := backoff.New(time.Second, 30*time.Second)
	opened := false
	for ctx.Err() == nil {
		next, st, err := open(ctx)
		if err == nil {
			for next() == nil {
				if opened {
					changed()
				} else {
					opened = true
					ready()
				}
				b.Reset()
			}
			st.Close()
		}
		if !b.Wait(ctx) {
			return
		}
	}
}
