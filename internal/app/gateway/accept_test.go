package gateway

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lanesdev/lanes/internal/testkit/faultln"
)

// TestAcceptErrorsWaitedOut: a run of EMFILE from accept (the process out
// of file descriptors) is waited out: the gateway serves the next
// connection, and Serve goes on (the world's cleanup checks that it returns
// http.ErrServerClosed only at Close).
func TestAcceptErrorsWaitedOut(t *testing.T) { onStacks(t, testAcceptErrorsWaitedOut) }

func testAcceptErrorsWaitedOut(t *testing.T) {
	var fl *faultln.Listener
	w := newWorldOn(t, "", Config{}, nil, func(l net.Listener) net.Listener {
		fl = faultln.New(l, 0, syscall.EMFILE)
		return fl
	}, nil)
	b := newBackend(t, "one", "")
	w.register(t, "orders", b.id, b.addr, "")
	expectServed(t, w.get(t, "/", nil), b.id, "")
	w.client.Transport.(*http.Transport).CloseIdleConnections()
	fl.Fail(6)
	expectServed(t, w.get(t, "/", nil), b.id, "")
	if n := fl.Errs.Load(); n != 6 {
		t.Errorf("%d accept errors, want 6", n)
	}
}

// halfOpen opens a connection to the gateway that sends part of a request
// head and stops: it holds one of the gateway's places until the client
// header timeout.
func halfOpen(t *testing.T, w *world) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", w.addr, waitFor)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: orders\r\n"); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestMaxConnsSheds: with max_conns 2 and two connections that hold a
// partial head, the third connection is answered 503 overloaded at once and
// closed, and counted; once one of the two closes, requests are served
// again.
func TestMaxConnsSheds(t *testing.T) { onStacks(t, testMaxConnsSheds) }

func testMaxConnsSheds(t *testing.T) {
	w := newWorld(t, "", Config{MaxConns: 2})
	b := newBackend(t, "one", "")
	w.register(t, "orders", b.id, b.addr, "")
	first := halfOpen(t, w)
	halfOpen(t, w)
	// The gateway accepts in order: the third connection is over the cap.
	r := w.send(t, "GET / HTTP/1.1\r\nHost: orders\r\n\r\n")
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatalf("the third connection: %v, want a 503", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(hError) != codeOverloaded || !resp.Close {
		t.Fatalf("the third connection got %d %q (close %v), want 503 overloaded with Connection: close", resp.StatusCode, resp.Header.Get(hError), resp.Close)
	}
	if want := "lanes: the gateway is at its limit of 2 open connections (max_conns); try again\n"; string(body) != want {
		t.Errorf("body %q, want %q", body, want)
	}
	if _, err := r.ReadByte(); err != io.EOF {
		t.Errorf("after the 503: %v, want the connection closed (EOF)", err)
	}
	if n := testutil.ToFloat64(w.gw.m.errorsV.WithLabelValues(codeOverloaded)); n < 1 {
		t.Errorf("lanes_gateway_errors_total{code=overloaded} = %v, want at least 1", n)
	}
	first.Close()
	eventually(t, "a request served after a connection closed", func() bool {
		w.client.Transport.(*http.Transport).CloseIdleConnections()
		return do(t, w.client, "GET", w.url+"/", nil).status == http.StatusOK
	})
}

// TestClientHeaderTimeout: a client that sends part of a head and stops,
// or drips it a byte at a time, has its connection closed after the client
// header timeout, counted from the connection's open (the
// fast path answers 408 first).
func TestClientHeaderTimeout(t *testing.T) { onStacks(t, testClientHeaderTimeout) }

func testClientHeaderTimeout(t *testing.T) {
	const d = 300 * time.Millisecond
	w := newWorld(t, "", Config{ClientHeaderTimeout: d})
	b := newBackend(t, "one", "")
	w.register(t, "orders", b.id, b.addr, "")
	for _, drip := range []bool{false, true} {
		start := time.Now()
		c := halfOpen(t, w)
		c.SetDeadline(time.Now().Add(waitFor))
		stop := make(chan struct{})
		dripped := make(chan struct{})
		go func() {
			defer close(dripped)
			if !drip {
				return
			}
			tick := time.NewTicker(d / 10)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					if _, err := io.WriteString(c, "x"); err != nil {
						return
					}
				}
			}
		}()
		got, err := io.ReadAll(bufio.NewReader(c))
		close(stop)
		<-dripped
		// A dripping client may write after the close: a reset.
		if err != nil && !(drip && errors.Is(err, syscall.ECONNRESET)) {
			t.Fatalf("drip %v: %v after %v; want the gateway to close the connection", drip, err, time.Since(start))
		}
		if el := time.Since(start); el < d/2 {
			t.Errorf("drip %v: closed after %v, before the timeout (%v)", drip, el, d)
		}
		if stackOf(t) == HTTP1Fast && !drip && !strings.HasPrefix(string(got), "HTTP/1.1 408 ") {
			t.Errorf("drip %v: got %q, want a 408", drip, got)
		}
	}
	// A whole head within the timeout is served.
	expectServed(t, w.get(t, "/", nil), b.id, "")
}
