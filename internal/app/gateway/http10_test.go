package gateway

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/lanesdev/lanes/internal/app/gateway/upstream"
)

// TestHTTP10ClientGetsNoChunks: an HTTP/1.0 client cannot read the chunked
// coding (RFC 9112 6.1: a server sends no Transfer-Encoding to a request
// of HTTP/1.0), so an answer whose length the gateway does not know ends
// with the connection instead, however short (a chunked
// answer is not read whole first: it may be an event stream); an answer
// the gateway knows the length of keeps its Content-Length.
func TestHTTP10ClientGetsNoChunks(t *testing.T) { onStacks(t, testHTTP10ClientGetsNoChunks) }

func testHTTP10ClientGetsNoChunks(t *testing.T) {
	w := newWorld(t, "", Config{})
	release := make(chan struct{})
	events := eventStream(release)
	addr := serveBackend(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/small": // chunked: net/http sends an answer flushed before its end so
			rw.(http.Flusher).Flush()
			fmt.Fprint(rw, "small answer")
		case "/stream":
			events(rw, r)
		case "/big":
			rw.Header().Set("Content-Length", fmt.Sprint(upstream.MaxBufferedBody+10))
			rw.Write(make([]byte, upstream.MaxBufferedBody+10))
		default:
			rw.(http.Flusher).Flush() // chunked
			rw.Write(make([]byte, upstream.MaxBufferedBody+10))
		}
	}))
	w.register(t, "orders", "old", addr, "")
	// ask sends the HTTP/1.0 request raw and reads the head of its answer,
	// which has no Transfer-Encoding.
	ask := func(t *testing.T, raw string) (*http.Response, *bufio.Reader) {
		t.Helper()
		br := w.send(t, raw)
		res, err := http.ReadResponse(br, &http.Request{Method: strings.Fields(raw)[0]})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.TransferEncoding) > 0 || res.Header.Get("Transfer-Encoding") != "" {
			t.Errorf("%q: Transfer-Encoding %q to an HTTP/1.0 client", raw, res.TransferEncoding)
		}
		return res, br
	}
	get := func(t *testing.T, path, conn string) (*http.Response, *bufio.Reader) {
		t.Helper()
		return ask(t, "GET "+path+" HTTP/1.0\r\nHost: x\r\n"+conn+"\r\n")
	}
	for _, tc := range []struct {
		path string
		want int
	}{{"/small", len("small answer")}, {"/big", upstream.MaxBufferedBody + 10}, {"/chunked-big", upstream.MaxBufferedBody + 10}} {
		for _, conn := range []string{"", "Connection: keep-alive\r\n"} {
			t.Run(strings.TrimPrefix(tc.path, "/")+map[bool]string{true: "/keep-alive"}[conn != ""], func(t *testing.T) {
				res, br := get(t, tc.path, conn)
				body, err := io.ReadAll(res.Body)
				if err != nil || len(body) != tc.want {
					t.Fatalf("body: %d bytes, %v; want %d", len(body), err, tc.want)
				}
				if res.ContentLength < 0 {
					// The body ended with the connection: nothing follows.
					if n, err := br.Read(make([]byte, 1)); n != 0 || err != io.EOF {
						t.Errorf("after a body without a length: %d bytes, %v; want the end of the connection", n, err)
					}
				}
			})
		}
	}
	// The requests that the fast path hands to the net/http handler: one
	// with a TE header, one with an absolute-form target.
	for _, raw := range []string{"GET /chunked-big HTTP/1.0\r\nHost: x\r\nTE: trailers\r\n\r\n", "GET http://x/chunked-big HTTP/1.0\r\nHost: x\r\n\r\n"} {
		t.Run("handed-over/"+strings.Fields(raw)[1], func(t *testing.T) {
			res, _ := ask(t, raw)
			if body, err := io.ReadAll(res.Body); err != nil || len(body) != upstream.MaxBufferedBody+10 {
				t.Errorf("body: %d bytes, %v; want %d", len(body), err, upstream.MaxBufferedBody+10)
			}
		})
	}
	t.Run("head", func(t *testing.T) {
		if res, _ := ask(t, "HEAD /chunked-big HTTP/1.0\r\nHost: x\r\n\r\n"); res.StatusCode != http.StatusOK {
			t.Errorf("HEAD: %d, want 200", res.StatusCode)
		}
	})
	t.Run("stream", func(t *testing.T) {
		res, _ := get(t, "/stream", "Connection: keep-alive\r\n")
		readEvents(t, res.Body, release)
	})
}

// TestHTTP10StreamEndsAtClose: Close waits for an answer that streams to an
// HTTP/1.0 client until the end of its connection, and ends it.
func TestHTTP10StreamEndsAtClose(t *testing.T) { onStacks(t, testHTTP10StreamEndsAtClose) }

func testHTTP10StreamEndsAtClose(t *testing.T) {
	w := newWorld(t, "", Config{})
	addr := serveBackend(t, eventStream(make(chan struct{}))) // the second event never comes
	w.register(t, "orders", "old", addr, "")
	br := w.send(t, "GET /events HTTP/1.0\r\nHost: x\r\n\r\n")
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := bufio.NewReader(res.Body)
	if line, err := body.ReadString('\n'); err != nil || line != "data: one\n" {
		t.Fatalf("first event: %q, %v", line, err)
	}
	closed := make(chan error, 1)
	go func() { closed <- w.gw.Close() }()
	if _, err := io.ReadAll(body); err != nil {
		t.Errorf("the answer's end at Close: %v; want the end of the connection", err)
	}
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
}

// TestHTTP10CutAnswerIsCut: an answer that the instance cuts short, sent to
// an HTTP/1.0 client without a length, does not end as a whole one does:
// the client's connection is reset.
func TestHTTP10CutAnswerIsCut(t *testing.T) { onStacks(t, testHTTP10CutAnswerIsCut) }

func testHTTP10CutAnswerIsCut(t *testing.T) {
	w := newWorld(t, "", Config{})
	addr := rawBackend(t, func() string {
		return "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n10\r\nnot all of"
	})
	w.register(t, "orders", "cut", addr, "")
	// The second is one that the fast path hands to the net/http handler.
	for _, raw := range []string{"GET / HTTP/1.0\r\nHost: x\r\n\r\n", "GET / HTTP/1.0\r\nHost: x\r\nTE: trailers\r\n\r\n"} {
		br := w.send(t, raw)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if body, err := io.ReadAll(res.Body); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("%q: the cut answer: %q, %v; want a reset of the connection, not the end a whole answer has", raw, body, err)
		}
	}
}
