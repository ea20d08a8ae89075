package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"
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
	go func() { // instances
		defer wg.Done()
		for ctx.Err() == nil {
			st, err := c.WatchInstances(ctx, "")
			if err != nil {
				sleep(ctx, time.Second)
				continue
			}
			first := true
			for {
				b, err := st.Next()
				if err != nil {
					break
				}
				if !first || !b.Reset {
					send("instances")
				}
				first = false
			}
			st.Close()
			sleep(ctx, time.Second)
		}
	}()
	go func() { // policy
		defer wg.Done()
		for ctx.Err() == nil {
			st, err := c.WatchPolicy(ctx)
			if err != nil {
				sleep(ctx, time.Second)
				continue
			}
			first := true
			for {
				if _, err := st.Next(); err != nil {
					break
				}
				if !first {
					send("policy")
				}
				first = false
			}
			st.Close()
			sleep(ctx, time.Second)
		}
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

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
