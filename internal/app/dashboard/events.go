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
		}, func() { send("instances") })
	}()
	go func() {
		defer wg.Done()
		follow(ctx, func(ctx context.Context) (func() error, io.Closer, error) {
			st, err := c.WatchPolicy(ctx)
			if err != nil {
				return nil, nil, err
			}
			return func() error { _, err := st.Next(); return err }, st, nil
		}, func() { send("policy") })
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

// follow keeps a watch open until ctx is done, reopening it after a
// capped, jittered delay, and calls changed on every item but the first of
// each stream (the state the page already shows, or shows after a reconnect
// on its next reload).
func follow(ctx context.Context, open func(context.Context) (next func() error, _ io.Closer, _ error), changed func()) {
	b := backoff.New(time.Second, 30*time.Second)
	for ctx.Err() == nil {
		next, st, err := open(ctx)
		if err == nil {
			for first := true; ; first = false {
				if next() != nil {
					break
				}
				if !first {
					changed()
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
