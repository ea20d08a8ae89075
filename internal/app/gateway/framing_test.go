package gateway

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The framing rules (framing.go), each on both stacks: no 1xx answer to an
// HTTP/1.0 client and Connection: close after a chunked request are
// TestEarlyHintsRules; the client read timeout is TestClientReadTimeout.

// TestClosingAnswer: a request that comes while the gateway closes gets 503
// closed, and its connection closes after it, through each stack's handler.
func TestClosingAnswer(t *testing.T) { onStacks(t, testClosingAnswer) }

func testClosingAnswer(t *testing.T) {
	w := newWorld(t, "", Config{})
	if err := w.gw.Close(); err != nil {
		t.Fatal(err)
	}
	var status int
	var code string
	var closes bool
	if f := fastOf(w.gw); f != nil {
		r := fastCtx(nil)
		f.handle(r.ctx)
		res := &r.ctx.Response
		status, code, closes = res.StatusCode(), string(res.Header.Peek(hError)), res.ConnectionClose()
	} else {
		rec := httptest.NewRecorder()
		w.gw.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		status, code, closes = rec.Code, rec.Header().Get(hError), rec.Header().Get("Connection") == "close"
	}
	if status != http.StatusServiceUnavailable || code != codeClosed || !closes {
		t.Errorf("after Close: %d, %s %q, close %v; want 503 closed, and the connection closed", status, hError, code, closes)
	}
}

// TestIdempotencyKeyRetried: a POST without a body that carries an
// Idempotency-Key or X-Idempotency-Key header, even an empty one
// (routedcall.IdempotentRequest), is sent again to another instance after
// one that took it failed it; without the header it is not (see
// TestNoRetryOfSentPOST).
func TestIdempotencyKeyRetried(t *testing.T) { onStacks(t, testIdempotencyKeyRetried) }

func testIdempotencyKeyRetried(t *testing.T) {
	w := newWorld(t, "outlier: {errors: 1000, window: 1m, ejection: 10m}\n", Config{})
	good := newBackend(t, "good", "")
	w.register(t, "orders", good.id, good.addr, "")
	w.register(t, "orders", "reset", resetter(t), "")
	for _, h := range []string{"Idempotency-Key: k1", "Idempotency-Key:", "X-Idempotency-Key: "} {
		for range 6 {
			br := w.send(t, "POST / HTTP/1.1\r\nHost: x\r\n"+h+"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, res.Body)
			if res.StatusCode != http.StatusOK || res.Header.Get(hLaneServed) != "baseline" {
				t.Fatalf("POST with %q: %d; want 200, retried on the good instance", h, res.StatusCode)
			}
		}
	}
}

// TestClientReadTimeout: a client that stops sending its request's body
// for the client read timeout gets 400 bad_request_body, and its connection
// is closed; the instance is not blamed.
func TestClientReadTimeout(t *testing.T) { onStacks(t, testClientReadTimeout) }

func testClientReadTimeout(t *testing.T) {
	w := newWorld(t, "", Config{ClientReadTimeout: 200 * time.Millisecond})
	b := newBackend(t, "one", "")
	w.register(t, "orders", b.id, b.addr, "")
	// A body that streams on both stacks (over bufferedRequestBody), of
	// which the client sends a part, then nothing.
	size := 4 * bufferedRequestBody
	br := w.send(t, fmt.Sprintf("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", size, strings.Repeat("a", size/2)))
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	if res.StatusCode != http.StatusBadRequest || res.Header.Get(hError) != codeBadBody || !res.Close {
		t.Errorf("%d, %s %q, Connection %q; want 400 %s and close", res.StatusCode, hError, res.Header.Get(hError), res.Header.Values("Connection"), codeBadBody)
	}
}
