package polyglot

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/childproc"
)

// sample is one request of a path, and when it was sent.
type sample struct {
	at time.Time
	a  answer
}

// traffic sends a request every 100 ms in each lane it was started with, and keeps the answers.
type traffic struct {
	mu      sync.Mutex
	samples map[string][]sample
	notify  chan struct{} // nudged on every sample
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func startTraffic(gateway string, lanes ...string) *traffic {
	ctx, cancel := context.WithCancel(context.Background())
	tr := &traffic{samples: map[string][]sample{}, notify: make(chan struct{}, 1), cancel: cancel}
	client := &http.Client{Timeout: 10 * time.Second}
	for _, l := range lanes {
		tr.wg.Add(1)
		go func() { // ends with ctx
			defer tr.wg.Done()
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case at := <-tick.C:
					a := call(client, gateway, l)
					tr.mu.Lock()
					tr.samples[l] = append(tr.samples[l], sample{at: at, a: a})
					tr.mu.Unlock()
					select {
					case tr.notify <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
	return tr
}

// stop ends the traffic and waits for its goroutines.
func (tr *traffic) stop() {
	tr.cancel()
	tr.wg.Wait()
}

// since returns the samples of lane l sent at or after t.
func (tr *traffic) since(l string, t time.Time) []sample {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []sample
	for _, s := range tr.samples[l] {
		if !s.at.Before(t) {
			out = append(out, s)
		}
	}
	return out
}

// fallback waits until a request of lane l sent after t is served by want, and returns the
// requests of l that failed from t until then and the time it took.
func (tr *traffic) fallback(t *testing.T, l string, from time.Time, want []hop) (failed int, took time.Duration) {
	t.Helper()
	deadline := time.After(wait)
	for {
		failed = 0
		for _, s := range tr.since(l, from) {
			if s.a.err == nil && sameChain(s.a.hops, want) {
				return failed, s.at.Sub(from)
			}
			if s.a.err != nil {
				failed++
			}
		}
		select {
		case <-tr.notify:
		case <-deadline:
			last := tr.since(l, from)
			t.Fatalf("lane %s: no request served by %s within %s of the kill; %d failed; the last: %v", name(l), chain(want), wait, failed, last[len(last)-1].a)
		}
	}
}

// settle waits until n requests of lane l were sent after t.
func (tr *traffic) settle(t *testing.T, l string, after time.Time, n int) {
	t.Helper()
	deadline := time.After(wait)
	for len(tr.since(l, after)) <= n {
		select {
		case <-tr.notify:
		case <-deadline:
			t.Fatalf("lane %s: fewer than %d requests within %s", name(l), n, wait)
		}
	}
}

// TestFaults kills the lane instances of the chain with SIGKILL while requests flow every 100 ms
// in the baseline and in lane alice: the app behind orders' sidecar, then (of a new orders
// instance) the sidecar, then the proxyless gRPC app of payments. It logs, for each, the requests
// of lane alice that failed and the seconds until alice's requests were served by the baseline,
// and checks that no baseline request failed or reached a lane instance.
func TestFaults(t *testing.T) {
	modules := prerequisites(t)
	s := startStack(t, modules)
	fleet := s.fleet()
	client := &http.Client{Timeout: 10 * time.Second}
	s.ready(client, "")
	s.ready(client, "alice")

	tr := startTraffic(s.gateway, "", "alice")
	start := time.Now()
	defer tr.stop()

	onBaseline := func(services ...string) []hop { // alice's chain with services on the baseline
		h := expected("alice")
		for i := range h {
			for _, svc := range services {
				if h[i].Service == svc {
					h[i].Lane = ""
				}
			}
		}
		return h
	}
	// kill kills p, waits until alice's requests are served by want, and then for 20 more
	// requests (2 s) to count the requests that failed after the kill.
	kill := func(what string, p *childproc.Child, want []hop) {
		t.Helper()
		at := time.Now()
		p.Kill()
		_, took := tr.fallback(t, "alice", at, want)
		tr.settle(t, "alice", at.Add(took), 20)
		after := tr.since("alice", at)
		failed, wrong := 0, 0
		for _, smp := range after {
			switch {
			case smp.a.err != nil:
				failed++
			case !sameChain(smp.a.hops, want) && !smp.at.Before(at.Add(took)):
				wrong++
			}
		}
		t.Logf("faults: kill -9 %s: lane alice: %d of %d requests failed in the %.1f s after the kill; served by the baseline %.1f s after it",
			what, failed, len(after), after[len(after)-1].at.Sub(at).Seconds(), took.Seconds())
		if wrong != 0 {
			t.Errorf("%s: %d requests of lane alice after the fallback were not served by %s", what, wrong, chain(want))
		}
	}

	kill("the orders app in lane alice (behind its sidecar)", fleet["orders@alice"].app, onBaseline("orders"))

	// A new orders instance in alice, then its sidecar killed.
	again := s.orders("alice")
	s.waitRegistered(again)
	if _, took := tr.fallback(t, "alice", time.Now(), expected("alice")); took < 0 {
		t.Fatal("unreachable")
	}
	kill("the orders sidecar in lane alice", again.sidecar, onBaseline("orders"))

	kill("the payments app in lane alice (proxyless gRPC, sidecar --direct)", fleet["payments@alice"].app, onBaseline("orders", "payments"))
	tr.stop()

	base := tr.since("", start)
	failed, leaked := 0, 0
	for _, smp := range base {
		if smp.a.err != nil {
			failed++
			continue
		}
		if !sameChain(smp.a.hops, expected("")) {
			leaked++
			t.Errorf("a baseline request was served by %s", chain(smp.a.hops))
		}
	}
	t.Logf("faults: baseline: %d requests, %d failed, %d served by a lane instance", len(base), failed, leaked)
	if failed != 0 {
		t.Errorf("%d baseline requests failed while lane instances were killed", failed)
	}
}
