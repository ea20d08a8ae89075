package gateway

import (
	"context"
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

// TestShutdownAnswers: Shutdown lets a request in flight get its answer,
// which closes its connection, and ends an idle keep-alive connection; on
// both stacks.
func TestShutdownAnswers(t *testing.T) { onStacks(t, testShutdownAnswers) }

func testShutdownAnswers(t *testing.T) {
	w := newWorld(t, "", Config{})
	entered, release := make(chan struct{}), make(chan struct{})
	addr := serveBackend(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/held" {
			close(entered)
			<-release
		}
		io.WriteString(rw, "ok")
	}))
	w.register(t, "orders", "held", addr, "")
	idle := w.send(t, "GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
	first, err := http.ReadResponse(idle, nil)
	if err != nil || first.StatusCode != http.StatusOK {
		t.Fatalf("the idle connection's first answer: %v, %v", first, err)
	}
	io.Copy(io.Discard, first.Body)
	busy := w.send(t, "GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
	<-entered
	shut := make(chan error, 1)
	go func() { shut <- w.gw.Shutdown(context.Background()) }()
	eventually(t, "the gateway to be closing", w.gw.closing.Load)
	// The idle connection ends without an answer.
	if _, err := idle.ReadByte(); err == nil {
		t.Error("the idle connection got bytes after Shutdown")
	}
	close(release)
	res, err := http.ReadResponse(busy, nil)
	if err != nil {
		t.Fatalf("the request in flight: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK || string(body) != "ok" || !res.Close {
		t.Errorf("the request in flight: %d %q, Connection %q; want 200 ok and close", res.StatusCode, body, res.Header.Values("Connection"))
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}
