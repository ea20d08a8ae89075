package laneshttp_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/timing"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// deadAndAlive starts two instances of orders and closes the listener of
// the first: connecting to it is refused, though it stays registered.
func deadAndAlive(t *testing.T, pol string) (*fleet, *backend, *backend) {
	f := newFleet(t, pol)
	dead, alive := f.start("dead orders"), f.start("alive orders")
	f.await("orders", 2)
	dead.srv.Close()
	return f, dead, alive
}

// TestRetryGETOnAnotherInstance: an idempotent request whose connection is
// refused is sent again to another instance.
func TestRetryGETOnAnotherInstance(t *testing.T) {
	f, _, alive := deadAndAlive(t, "")
	c := f.client()
	for i := range 10 {
		if code, body := get(t, bg(t), c, "http://orders/"); code != 200 || body != "alive" {
			t.Fatalf("GET %d: %d %q", i, code, body)
		}
	}
	// A PUT with a replayable body is retried with the whole body.
	for i := range 4 {
		code, body, _, err := call(bg(t), c, http.MethodPut, "http://orders/", strings.NewReader("payload"))
		if err != nil || code != 200 || body != "alive" {
			t.Fatalf("PUT %d: %d %q %v", i, code, body, err)
		}
		if _, got := alive.lastRequest(); got != "payload" {
			t.Fatalf("PUT %d: body %q", i, got)
		}
	}
}

// resetAndAlive starts two instances of orders; the first reads each
// request and then resets the connection without answering: the request was
// sent, and no answer comes.
func resetAndAlive(t *testing.T, pol string) (*fleet, *backend) {
	f := newFleet(t, pol)
	f.startResetter("reset orders")
	alive := f.start("alive orders")
	f.await("orders", 2)
	return f, alive
}

// startResetter registers an instance that reads each request, then resets
// its connection.
func (f *fleet) startResetter(spec string) {
	t := f.t
	t.Helper()
	in := parseSpec(t, spec)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	in.Addr = ln.Addr().String()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			if req, err := http.ReadRequest(bufio.NewReader(conn)); err == nil {
				io.Copy(io.Discard, req.Body)
			}
			conn.(*net.TCPConn).SetLinger(0) // a reset, not an orderly close
			conn.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	lease, err := f.reg.Register(context.Background(), in, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lease.Close() })
}

// TestNoRetryForPOST: a request that is not idempotent, and that reached an
// instance that failed it, is not sent twice, unless configured.
func TestNoRetryForPOST(t *testing.T) {
	f, alive := resetAndAlive(t, "outlier: {errors: 1000}\n") // no ejection: every other pick is the resetter
	post := func(c *http.Client, hdr ...string) (ok, failed int) {
		for range 4 {
			_, body, _, err := call(bg(t), c, http.MethodPost, "http://orders/", bytes.NewReader([]byte("order")), hdr...)
			switch {
			case err == nil && body == "alive":
				ok++
			case err != nil && !errors.As(err, new(*routing.Error)):
				failed++
			default:
				t.Fatalf("got %q, %v", body, err)
			}
		}
		return ok, failed
	}
	hits := alive.hits.Load()
	if ok, failed := post(f.client()); ok != 2 || failed != 2 || alive.hits.Load() != hits+2 {
		t.Fatalf("POST: %d ok, %d failed; want 2 and 2: no retry", ok, failed)
	}
	if ok, failed := post(f.client(), "Idempotency-Key", "k"); ok != 4 || failed != 0 {
		t.Fatalf("POST with Idempotency-Key: %d ok, %d failed; want retries", ok, failed)
	}
	all := laneshttp.WithIdempotent(func(*http.Request) bool { return true })
	if ok, failed := post(f.client(all)); ok != 4 || failed != 0 {
		t.Fatalf("POST, configured idempotent: %d ok, %d failed; want retries", ok, failed)
	}
	if ok, failed := post(f.client(all, laneshttp.WithRetries(-1))); ok != 2 || failed != 2 {
		t.Fatalf("retries off: %d ok, %d failed", ok, failed)
	}
}

// TestRefusedMovesOn: a refused connection sent nothing, so any request
// moves on at once to another instance, whatever its method and the retry
// setting, and the refusing instance is ejected at its first refusal.
func TestRefusedMovesOn(t *testing.T) {
	f, dead, alive := deadAndAlive(t, "outlier: {errors: 3}\n")
	c := f.client(laneshttp.WithRetries(-1))
	for i := range 6 {
		code, body, _, err := call(bg(t), c, http.MethodPost, "http://orders/", bytes.NewReader([]byte("order")))
		if err != nil || code != 200 || body != "alive" {
			t.Fatalf("POST %d: %d %q %v", i, code, body, err)
		}
	}
	if d, err := f.e.Service("orders").Resolve(routing.Request{}); err != nil || strings.Join(d.Eligible, " ") != alive.id {
		t.Fatalf("eligible after the refusals: %v %v, want %s alone (%s ejected)", d.Eligible, err, alive.id, dead.id)
	}
}

// TestRefusedLaneFallsBack: when the only instance of a lane refuses the
// connection, the same request goes along the fallback chain to the
// baseline.
func TestRefusedLaneFallsBack(t *testing.T) {
	f := newFleet(t, "")
	dead := f.start("dead orders lane=alice")
	f.start("base orders")
	f.await("orders", 2)
	dead.srv.Close()
	c := f.client()
	ctx := lane.WithLane(bg(t), "alice")
	for i := range 4 {
		if code, body := get(t, ctx, c, "http://orders/"); code != 200 || body != "base" {
			t.Fatalf("GET %d in lane alice: %d %q, want the baseline's answer", i, code, body)
		}
	}
}

// TestNoRetryWithoutReplayableBody: a body that cannot be sent again is not.
func TestNoRetryWithoutReplayableBody(t *testing.T) {
	f, _ := resetAndAlive(t, "outlier: {errors: 1000}\n")
	c := f.client()
	failed := 0
	for range 4 {
		req, _ := http.NewRequestWithContext(bg(t), http.MethodPut, "http://orders/", io.NopCloser(strings.NewReader("x")))
		if res, err := c.Do(req); err != nil {
			failed++
		} else {
			res.Body.Close()
		}
	}
	if failed != 2 {
		t.Fatalf("%d failed, want 2", failed)
	}
}

// TestRetryStatus: a configured status is retried on another instance, for
// idempotent requests; a 503 is not retried by default.
func TestRetryStatus(t *testing.T) {
	f := newFleet(t, "outlier: {errors: 1000}\n")
	busy := f.start("busy orders")
	f.start("ok orders")
	f.await("orders", 2)
	busy.status.Store(503)
	count := func(c *http.Client) map[int]int {
		seen := map[int]int{}
		for range 4 {
			code, _ := get(t, bg(t), c, "http://orders/")
			seen[code]++
		}
		return seen
	}
	if seen := count(f.client()); seen[503] != 2 {
		t.Fatalf("default: %v, want the 503s returned", seen)
	}
	if seen := count(f.client(laneshttp.WithRetryStatus(func(c int) bool { return c == 503 }))); seen[200] != 4 {
		t.Fatalf("RetryStatus 503: %v, want every request served", seen)
	}
}

// TestMisdirectedIsRetried: when the caller's view is stale and the guard of
// the instance refuses a request, it is sent to another instance, whatever
// its method: the guard answered before any handler ran.
func TestMisdirectedIsRetried(t *testing.T) {
	f := newFleet(t, "")
	// The caller sees two baseline instances, but the first is, in its own
	// view, an instance of lane alice (it was moved, say, and the caller
	// has not heard yet).
	moved := f.start("moved orders", func(in registry.Instance, h http.Handler) http.Handler {
		in.Lane = "alice"
		return laneshttp.Handler(h, laneshttp.WithGuard(guardFor(f.e, in)), laneshttp.WithLogger(quiet))
	})
	f.start("base orders")
	f.await("orders", 2)
	c := f.client()
	for i := range 4 {
		code, body, _, err := call(bg(t), c, http.MethodPost, "http://orders/", strings.NewReader("x"))
		if err != nil || code != 200 || body != "base" {
			t.Fatalf("POST %d: %d %q %v", i, code, body, err)
		}
	}
	if moved.hits.Load() != 0 {
		t.Fatal("the guard let a baseline request through")
	}
	// A lane request that the moved instance admits is served there.
	ctx := lane.WithLane(bg(t), "alice")
	served := map[string]int{}
	for range 4 {
		_, body := get(t, ctx, c, "http://orders/")
		served[body]++
	}
	if served["moved"] != 2 {
		t.Fatalf("alice requests: %v", served)
	}
}

// startHung starts an instance of orders that accepts requests and never
// answers them (until the end of the test).
func (f *fleet) startHung(spec string) *backend {
	release := make(chan struct{})
	b := f.start(spec, func(_ registry.Instance, h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		})
	})
	f.t.Cleanup(func() { close(release) }) // before the server's Close
	return b
}

// eligible returns the ids that a baseline request of orders may reach.
func eligible(t *testing.T, f *fleet) string {
	d, err := f.e.Service("orders").Resolve(routing.Request{})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(d.Eligible, " ")
}

// TestHungInstanceEjected: an instance that never answers fails the
// attempt after the response-header timeout, and is ejected at once,
// whatever the policy's errors and window: with one caller at a time, 5
// timeouts could never fit a 30 s window, and every request would wait for
// one. The GET is retried on another instance, and the next requests go
// there straight away.
func TestHungInstanceEjected(t *testing.T) {
	f := newFleet(t, "") // the default outlier settings: 5 errors in 30 s
	f.startHung("hung orders")
	f.start("alive orders")
	f.await("orders", 2)
	// The default base, which enforces the timeout.
	hdr := timing.Bound(300 * time.Millisecond) // the live instance answers well within it, even on a loaded machine
	c := laneshttp.NewClient(f.e, laneshttp.WithEnv(noEnv), laneshttp.WithResponseHeaderTimeout(hdr))
	t.Cleanup(c.CloseIdleConnections)
	delayed := 0
	for i := range 10 {
		start := time.Now()
		if code, body := get(t, bg(t), c, "http://orders/"); code != 200 || body != "alive" {
			t.Fatalf("GET %d: %d %q", i, code, body)
		}
		if time.Since(start) >= hdr {
			delayed++
		}
		if got := eligible(t, f); got != "alive" && delayed > 0 {
			t.Fatalf("after GET %d, the first one the hung instance took: eligible %q, want alive alone", i, got)
		}
	}
	if delayed != 1 {
		t.Fatalf("%d of 10 sequential GETs waited for the response-header timeout, want 1", delayed)
	}
}

// TestAbandonedAfterTimeoutCounts: a call that the caller abandons after
// the instance took longer than the response-header timeout counts as a
// failure, even when the base transport did not enforce the timeout; one
// abandoned sooner says nothing about the instance.
func TestAbandonedAfterTimeoutCounts(t *testing.T) {
	f := newFleet(t, "outlier: {errors: 2, window: 1m}\n")
	f.startHung("hung orders")
	f.await("orders", 1)
	base := &http.Transport{} // no timeout of its own
	t.Cleanup(base.CloseIdleConnections)
	abandon := func(timeout, after time.Duration) {
		c := laneshttp.NewClient(f.e, laneshttp.WithBase(base), laneshttp.WithEnv(noEnv), laneshttp.WithResponseHeaderTimeout(timeout))
		for range 2 {
			ctx, cancel := context.WithTimeout(bg(t), after)
			if _, _, _, err := call(ctx, c, http.MethodGet, "http://orders/", nil); err == nil {
				t.Fatal("the hung instance answered")
			}
			cancel()
		}
	}
	abandon(time.Minute, 20*time.Millisecond) // abandoned early: no verdict
	if got := eligible(t, f); got != "hung" {
		t.Fatalf("eligible %q after calls abandoned before the timeout, want hung", got)
	}
	abandon(20*time.Millisecond, 60*time.Millisecond)
	// The baseline's panic mode keeps an ejected instance eligible when
	// every one is ejected: the reason tells.
	d, _ := f.e.Service("orders").Resolve(routing.Request{})
	if d.Reason != routing.ReasonPanic {
		t.Fatalf("after two calls abandoned past the timeout: %+v, want the instance ejected (panic mode)", d)
	}
}

// startPaused registers an instance whose listener is never served: the
// kernel completes the connections, and nothing reads or answers them, as
// with a process stopped with SIGSTOP.
func (f *fleet) startPaused(spec string) {
	t := f.t
	t.Helper()
	in := parseSpec(t, spec)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	in.Addr = ln.Addr().String()
	lease, err := f.reg.Register(context.Background(), in, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lease.Close() })
}

// TestPausedInstanceEjected: an instance that accepts connections and
// reads nothing (a process stopped with SIGSTOP) is ejected like a hung
// one, and GETs are served by another instance meanwhile.
func TestPausedInstanceEjected(t *testing.T) {
	f := newFleet(t, "outlier: {errors: 3, window: 1m}\n")
	f.startPaused("paused orders")
	f.start("alive orders")
	f.await("orders", 2)
	c := laneshttp.NewClient(f.e, laneshttp.WithEnv(noEnv), laneshttp.WithResponseHeaderTimeout(timing.Bound(300*time.Millisecond)))
	t.Cleanup(c.CloseIdleConnections)
	start := time.Now()
	for i := 0; eligible(t, f) != "alive"; i++ {
		if code, body := get(t, bg(t), c, "http://orders/"); code != 200 || body != "alive" {
			t.Fatalf("GET %d: %d %q", i, code, body)
		}
	}
	t.Logf("the paused instance was ejected %v after the first request", time.Since(start).Round(time.Millisecond))
}

// TestRetryFollowsTheLaneChain: when the only instance of a lane takes the
// request and then fails it (it resets the connection, or never answers
// within the response-header timeout), an idempotent request is retried
// along the lane chain, on the baseline, also while the instance is not
// ejected (a reset is one failure of the policy's many; a hung instance is
// ejected at once); a POST is not retried.
func TestRetryFollowsTheLaneChain(t *testing.T) {
	t.Run("reset", func(t *testing.T) {
		f := newFleet(t, "outlier: {errors: 1000}\n") // no ejection: every call first goes to alice's instance
		f.startResetter("reset orders lane=alice")
		base := f.start("base orders")
		f.await("orders", 2)
		c := f.client()
		ctx := lane.WithLane(bg(t), "alice")
		for i := range 4 {
			if code, body := get(t, ctx, c, "http://orders/"); code != 200 || body != "base" {
				t.Fatalf("GET %d in lane alice: %d %q, want the baseline's answer on the retry", i, code, body)
			}
			if r, _ := base.lastRequest(); r.Header.Get("X-Lane") != "alice" {
				t.Fatalf("GET %d: the baseline got lane %q, want alice (the lane keeps travelling)", i, r.Header.Get("X-Lane"))
			}
		}
		if d, err := f.e.Service("orders").Resolve(routing.Request{Lane: "alice"}); err != nil || d.Lane != "alice" {
			t.Fatalf("alice after the retries: %+v, %v; want alice's instance still eligible", d, err)
		}
		hits := base.hits.Load()
		_, _, _, err := call(ctx, c, http.MethodPost, "http://orders/", strings.NewReader("order"))
		if err == nil || errors.As(err, new(*routing.Error)) || base.hits.Load() != hits {
			t.Fatalf("POST in lane alice: %v (baseline hits %d, was %d); want the reset, and no retry", err, base.hits.Load(), hits)
		}
	})
	t.Run("hung", func(t *testing.T) {
		f := newFleet(t, "outlier: {errors: 1000}\n")
		f.startHung("hung orders lane=alice")
		f.start("base orders")
		f.await("orders", 2)
		// The default base, which enforces the timeout.
		c := laneshttp.NewClient(f.e, laneshttp.WithEnv(noEnv), laneshttp.WithResponseHeaderTimeout(timing.Bound(300*time.Millisecond)))
		t.Cleanup(c.CloseIdleConnections)
		ctx := lane.WithLane(bg(t), "alice")
		for i := range 2 {
			if code, body := get(t, ctx, c, "http://orders/"); code != 200 || body != "base" {
				t.Fatalf("GET %d in lane alice: %d %q, want the baseline's answer on the retry", i, code, body)
			}
		}
	})
}

// TestUploadToPausedInstance: an instance that accepts connections and reads
// nothing (a process stopped with SIGSTOP) takes none of an upload once the
// socket buffers are full. The attempt fails after the write timeout instead
// of waiting for ever (the response-header timeout only starts once the
// request is written), and a PUT, idempotent and with a body that can be
// sent again, is retried on another instance; a POST fails, naming the
// timeout.
func TestUploadToPausedInstance(t *testing.T) {
	f := newFleet(t, "outlier: {errors: 1000}\n") // no ejection: every other attempt goes to the paused instance
	f.startPaused("paused orders")
	f.start("alive orders")
	f.await("orders", 2)
	// The live instance must read every write within the write timeout:
	// 1 s held alone, but not always in the whole suite under -race on a
	// loaded 2-core machine, where the process can get no CPU for that long.
	writeTimeout := timing.Bound(3 * time.Second)
	// And the live instance must answer within the response-header timeout
	// once the whole body is written: the default 10 s, scaled, as reading
	// the last megabytes of the body can take that long on a starved
	// process under -race. The paused instance never gets that far.
	headerTimeout := timing.Bound(laneshttp.DefaultResponseHeaderTimeout)
	c := laneshttp.NewClient(f.e, laneshttp.WithEnv(noEnv), laneshttp.WithWriteTimeout(writeTimeout), laneshttp.WithResponseHeaderTimeout(headerTimeout))
	t.Cleanup(c.CloseIdleConnections)
	body := bytes.Repeat([]byte("x"), 48<<20) // well over what loopback sockets buffer
	for i := range 2 {                        // round robin: one of them goes to the paused instance first
		code, got, _, err := call(bg(t), c, http.MethodPut, "http://orders/", bytes.NewReader(body))
		if err != nil || code != 200 || got != "alive" {
			t.Fatalf("PUT %d: %d %q, %v; want alive's answer, on the retry if it went to the paused instance first", i, code, got, err)
		}
	}
	for i := 0; ; i++ {
		code, got, _, err := call(bg(t), c, http.MethodPost, "http://orders/", bytes.NewReader(body))
		if err == nil {
			if code != 200 || got != "alive" || i >= 3 {
				t.Fatalf("POST %d: %d %q; want alive's answer, or the paused instance's write timeout within 4 POSTs", i, code, got)
			}
			continue
		}
		if !strings.Contains(err.Error(), "the instance took none of the request for "+writeTimeout.String()+" (the write timeout)") {
			t.Fatalf("POST %d to the paused instance: %v; want the write timeout", i, err)
		}
		break
	}
}
