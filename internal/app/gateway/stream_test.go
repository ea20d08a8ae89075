package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/app/gateway/upstream"
)

// TestStreamingResponse: an answer of unknown length reaches the client as
// the instance writes it, not when it ends (server-sent events, say).
func TestStreamingResponse(t *testing.T) { onStacks(t, testStreamingResponse) }

func testStreamingResponse(t *testing.T) {
	w := newWorld(t, "", Config{})
	release := make(chan struct{})
	addr := serveBackend(t, eventStream(release))
	w.register(t, "orders", "sse", addr, "")
	res, err := w.client.Get(w.url + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	readEvents(t, res.Body, release)
	if got := res.Header.Get("X-Lane-Served"); got != "baseline" {
		t.Errorf("x-lane-served %q, want baseline", got)
	}
}

// TestLargeAnswerStreams: an answer of known length larger than
// upstream.MaxBufferedBody reaches the client as the instance writes it, on both
// paths, for a request with a TE header too, which the fast path hands to
// the net/http handler (whose adaptor would hold the answer whole).
func TestLargeAnswerStreams(t *testing.T) { onStacks(t, testLargeAnswerStreams) }

func testLargeAnswerStreams(t *testing.T) {
	w := newWorld(t, "", Config{})
	// The client reads the first upstream.MaxBufferedBody bytes before the instance
	// writes the rest; the gateway's write buffers may hold the end of the
	// first part (slack).
	const first, slack, rest = upstream.MaxBufferedBody + 256<<10, 256 << 10, 256 << 10
	release := make(chan struct{}, 1)
	addr := serveBackend(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Length", fmt.Sprint(first+rest))
		rw.Write(make([]byte, first))
		rw.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		rw.Write(make([]byte, rest))
	}))
	w.register(t, "orders", "big", addr, "")
	for _, te := range []bool{false, true} {
		req, err := http.NewRequest(http.MethodGet, w.url+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		if te {
			req.Header.Set("TE", "trailers")
		}
		res, err := w.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(res.Body, make([]byte, first-slack)); err != nil {
			res.Body.Close()
			t.Fatalf("te %v: the first %d bytes, before the instance writes the rest: %v", te, first-slack, err)
		}
		release <- struct{}{}
		n, err := io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if err != nil || n != slack+rest {
			t.Errorf("te %v: the rest: %d bytes, %v; want %d", te, n, err, slack+rest)
		}
	}
}

// TestTrailers: the trailers of a chunked answer reach the client.
func TestTrailers(t *testing.T) { onStacks(t, testTrailers) }

func testTrailers(t *testing.T) {
	w := newWorld(t, "", Config{})
	addr := serveBackend(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Trailer", "X-Checksum")
		rw.WriteHeader(http.StatusOK)
		fmt.Fprint(rw, strings.Repeat("x", 10000))
		rw.(http.Flusher).Flush()
		rw.Header().Set("X-Checksum", "abc")
	}))
	w.register(t, "orders", "tr", addr, "")
	res, err := w.client.Get(w.url + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || len(body) != 10000 {
		t.Fatalf("body: %d bytes, %v", len(body), err)
	}
	if got := res.Trailer.Get("X-Checksum"); got != "abc" {
		t.Errorf("trailer X-Checksum %q, want abc (trailers %v)", got, res.Trailer)
	}
}

// TestStreamingRequestBody: a chunked request body reaches the instance
// whole, and a large body of known length too.
func TestStreamingRequestBody(t *testing.T) { onStacks(t, testStreamingRequestBody) }

func testStreamingRequestBody(t *testing.T) {
	w := newWorld(t, "", Config{})
	w.register(t, "orders", "up", byteCounter(t), "")
	for _, c := range []struct {
		name  string
		body  io.Reader
		chunk bool
	}{
		{"chunked", strings.NewReader(strings.Repeat("y", 300000)), true},
		{"large", strings.NewReader(strings.Repeat("z", 3<<20)), false},
	} {
		req, _ := http.NewRequest(http.MethodPost, w.url+"/upload", c.body)
		if c.chunk {
			req.ContentLength = -1
			req.Body = io.NopCloser(req.Body) // no length known: chunked
		}
		res, err := w.client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, _ := io.ReadAll(res.Body)
		res.Body.Close()
		want := map[bool]string{true: "300000", false: fmt.Sprint(3 << 20)}[c.chunk]
		if res.StatusCode != 200 || string(got) != want {
			t.Errorf("%s: %d %q, want 200 %q", c.name, res.StatusCode, got, want)
		}
	}
}

// TestExpectContinue: a client that waits for 100 Continue before its body
// gets it, and its request goes through.
func TestExpectContinue(t *testing.T) { onStacks(t, testExpectContinue) }

func testExpectContinue(t *testing.T) {
	w := newWorld(t, "", Config{})
	addr := serveBackend(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(rw, "got %s", b)
	}))
	w.register(t, "orders", "up", addr, "")
	c, err := net.DialTimeout("tcp", w.addr, waitFor)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(waitFor))
	fmt.Fprint(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusContinue {
		t.Fatalf("before the body: %v, %v; want 100 Continue", res, err)
	}
	fmt.Fprint(c, "hello")
	res, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 || string(b) != "got hello" {
		t.Errorf("answer %d %q, want 200 \"got hello\"", res.StatusCode, b)
	}
}

// TestWebSocketUpgrade: an upgrade goes through with the lane the gateway
// decided, and the connection then carries bytes both ways.
func TestWebSocketUpgrade(t *testing.T) { onStacks(t, testWebSocketUpgrade) }

func testWebSocketUpgrade(t *testing.T) {
	w := newWorld(t, "", Config{})
	seen := make(chan string, 1)
	addr := serveBackend(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(rw, "want an upgrade", http.StatusBadRequest)
			return
		}
		seen <- r.Header.Get("X-Lane")
		c, brw, err := rw.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprint(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		line, err := brw.ReadString('\n')
		if err != nil {
			return
		}
		fmt.Fprint(brw, "echo "+line)
		brw.Flush()
	}))
	w.register(t, "orders", "ws", addr, "")
	w.register(t, "orders", "ws-alice", addr, "alice")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", w.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(waitFor))
	fmt.Fprint(c, "GET /ws HTTP/1.1\r\nHost: x\r\nX-Lane: alice\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d, want 101", res.StatusCode)
	}
	if got := <-seen; got != "alice" {
		t.Errorf("the instance saw x-lane %q, want alice", got)
	}
	fmt.Fprint(c, "ping\n")
	line, err := br.ReadString('\n')
	if err != nil || line != "echo ping\n" {
		t.Errorf("over the upgraded connection: %q, %v; want \"echo ping\"", line, err)
	}
}
