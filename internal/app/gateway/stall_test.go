package gateway

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/app/gateway/upstream"
	"github.com/lanesdev/lanes/internal/testkit/buftest"
	"github.com/lanesdev/lanes/routing"
)

// TestStalledAnswer: an instance that sends the head of an answer and a part
// of its body, and then nothing more without closing (hung, or paused in the
// middle of it), has the answer cut once it has sent nothing for the upstream
// read timeout: the client never gets a whole answer (its
// connection closes before the end of the body), the gateway logs the
// timeout, and the instance is ejected. A small body of known length, which
// the fast path reads whole before the head goes to the client, fails there
// with 502 upstream naming the timeout. The response-header timeout is far
// off: the read bound alone ends the answer.
func TestStalledAnswer(t *testing.T) { onStacks(t, testStalledAnswer) }

func testStalledAnswer(t *testing.T) {
	const timeout = 200 * time.Millisecond
	for _, c := range []struct{ name, head string }{
		{"large", "HTTP/1.1 200 OK\r\nContent-Length: 4194304\r\n\r\npart"},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\npart\r\n"},
		{"small", "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart"},
	} {
		t.Run(c.name, func(t *testing.T) {
			logs := &buftest.Buffer{}
			w := newWorld(t, "outlier: {errors: 1, window: 1m, ejection: 10m}\n", Config{
				UpstreamReadTimeout: timeout, ResponseHeaderTimeout: time.Hour,
				Logger: slog.New(slog.NewTextHandler(logs, nil))})
			w.register(t, "orders", "stall", deaf(t, c.head), "")
			res, err := w.client.Get(w.url + "/")
			switch {
			case err != nil:
				// Cut before the head reached the client (the server held
				// it in its buffer).
			case c.name == "small" && stackOf(t) == HTTP1Fast:
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusBadGateway || res.Header.Get(hError) != codeUpstream ||
					!strings.Contains(string(body), "upstream read timeout") {
					t.Fatalf("%d %q %q, want 502 upstream naming the upstream read timeout", res.StatusCode, res.Header.Get(hError), body)
				}
			default:
				body, err := io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusOK || err == nil {
					t.Fatalf("%d %q, err %v: want the instance's 200 cut short", res.StatusCode, body, err)
				}
			}
			eventually(t, "a log line naming the upstream read timeout", func() bool { return logs.Contains("upstream read timeout") })
			// Reported: the instance is out of the eligible set.
			w.register(t, "orders", "good", byteCounter(t), "")
			eventually(t, "the stalled instance to be ejected", func() bool {
				d, err := w.engine.Service("orders").Resolve(routing.Request{})
				return err == nil && strings.Join(d.Eligible, " ") == "good"
			})
		})
	}
}

// TestSlowClient: a client that sends a request and then reads none of its
// answer has its connection closed once it has taken none of a write for the
// client write timeout, which ends the call: the instance,
// which streams without end, finds its connection closed.
func TestSlowClient(t *testing.T) { onStacks(t, testSlowClient) }

func testSlowClient(t *testing.T) {
	w := newWorld(t, "", Config{ClientWriteTimeout: 200 * time.Millisecond})
	cut := make(chan error, 1)
	w.register(t, "orders", "endless", serveBackend(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 32<<10)
		for {
			if _, err := rw.Write(buf); err != nil {
				cut <- err
				return
			}
		}
	})), "")
	c, err := net.Dial("tcp", w.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cut:
	case <-time.After(waitFor):
		t.Fatalf("the instance still writes %s after a client that reads nothing", waitFor)
	}
	// The client's connection is closed: what it holds ends.
	c.SetReadDeadline(time.Now().Add(waitFor))
	if _, err := io.Copy(io.Discard, c); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the client's connection is still open: %v", err)
	}
}

// TestCutAnswer: an answer that the instance cuts in the middle of its body,
// by stalling past the upstream read timeout, or by resetting or closing the
// connection, never reaches the client as a whole answer,
// and on each route of the fast path: its own, and the net/http handler's,
// to which it hands a request with a TE header or with an absolute-form
// target (adapt).
// The client gets no answer (the head was still in the gateway's buffers),
// the gateway's 502 (a small body that the fast path reads whole before the
// head goes out), or the instance's head with a body cut short of its
// Content-Length or without its last chunk: never a complete answer, short
// or not.
func TestCutAnswer(t *testing.T) { onStacks(t, testCutAnswer) }

func testCutAnswer(t *testing.T) {
	const timeout = 200 * time.Millisecond
	requests := []struct{ name, raw string }{
		{"origin", "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"te", "GET / HTTP/1.1\r\nHost: x\r\nTE: trailers\r\n\r\n"},
		{"absolute", "GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n"},
	}
	answers := []struct{ name, head string }{
		{"small", "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart"},
		{"large", "HTTP/1.1 200 OK\r\nContent-Length: 4194304\r\n\r\npart"},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\npart\r\n"},
		// More than the fast path holds before it flushes the head
		// (streamingWriter).
		{"flushed", "HTTP/1.1 200 OK\r\nContent-Length: 4194304\r\n\r\n" + strings.Repeat("p", upstream.MaxBufferedBody+64<<10)},
	}
	for _, how := range []string{"stall", "reset", "close"} {
		for _, a := range answers {
			for _, rq := range requests {
				t.Run(how+"/"+a.name+"/"+rq.name, func(t *testing.T) {
					w := newWorld(t, "", Config{UpstreamReadTimeout: timeout, ResponseHeaderTimeout: time.Hour})
					var addr string
					switch how {
					case "stall":
						addr = deaf(t, a.head)
					default:
						addr = cutAfter(t, a.head, how == "reset")
					}
					w.register(t, "orders", "cut", addr, "")
					if got := rawAnswer(t, w.addr, rq.raw); got != "" {
						t.Fatal(got)
					}
				})
			}
		}
	}
}

// rawAnswer sends the request raw to the gateway at addr on a connection of
// its own and reads the answer, which is cut: it returns what is wrong with
// it, or "" when the client could not take it for a whole answer (none
// came, or the gateway's 502, or a body that ends before its end).
func rawAnswer(t *testing.T, addr, raw string) string {
	c, err := net.DialTimeout("tcp", addr, waitFor)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(waitFor))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Sprintf("no answer within %s: %v", waitFor, err)
		}
		return "" // closed before any answer
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Sprintf("%d: the body did not end within %s", res.StatusCode, waitFor)
	case res.StatusCode == http.StatusBadGateway && res.Header.Get(hError) == codeUpstream:
		return ""
	case res.StatusCode == http.StatusOK && err != nil:
		return ""
	}
	return fmt.Sprintf("%d %q, a body of %d bytes (Content-Length %d, Transfer-Encoding %q), err %v: a complete answer, want a cut one",
		res.StatusCode, res.Header.Get(hError), len(body), res.ContentLength, res.TransferEncoding, err)
}

// cutAfter is an instance that reads the head of the first request of each
// connection, writes answer, and closes the connection, with reset by
// resetting it. It returns its address.
func cutAfter(t testing.TB, answer string, reset bool) string {
	return acceptLoop(t, func(c net.Conn) {
		c.SetReadDeadline(time.Now().Add(waitFor))
		if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			io.WriteString(c, answer)
		}
		if reset {
			c.(*net.TCPConn).SetLinger(0)
		}
		c.Close()
	})
}
