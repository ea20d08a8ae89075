package laneshttp_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

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

// TestNoRetryForPOST: a request that is not idempotent is not sent twice,
// unless configured.
func TestNoRetryForPOST(t *testing.T) {
	f, _, alive := deadAndAlive(t, "outlier: {errors: 1000}\n") // no ejection: every other pick is the dead one
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

// TestNoRetryWithoutReplayableBody: a body that cannot be sent again is not.
func TestNoRetryWithoutReplayableBody(t *testing.T) {
	f, _, _ := deadAndAlive(t, "outlier: {errors: 1000}\n")
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
		return laneshttp.Handler(h, laneshttp.WithGuard(f.e, in), laneshttp.WithLogger(quiet))
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
