package gateway

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/buftest"
	"github.com/lanesdev/lanes/routing"
)

// TestStalledAnswer: an instance that sends the head of an answer and a part
// of its body, and then nothing more without closing (hung, or paused in the
// middle of it), has the answer cut once it has sent nothing for the upstream
// read timeout, on both paths: the client never gets a whole answer (its
// connection closes before the end of the body), the gateway logs the
// timeout, and the instance is ejected. A small body of known length, which
// the fast path reads whole before the head goes to the client, fails there
// with 502 upstream naming the timeout. The response-header timeout is far
// off: the read bound alone ends the answer.
func TestStalledAnswer(t *testing.T) {
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
			case c.name == "small" && testHTTP1 == HTTP1Fast:
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
// client write timeout, on both paths, which ends the call: the instance,
// which streams without end, finds its connection closed.
func TestSlowClient(t *testing.T) {
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
