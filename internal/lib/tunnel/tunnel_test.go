package tunnel

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/testkit/leaktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

// echo serves connections that answer each line with "<name>: <line>".
func echo(t *testing.T, name string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					fmt.Fprintf(c, "%s: %s", name, line)
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln
}

func roundTrip(t *testing.T, c net.Conn, line string) string {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(got)
}

// server is a control plane's end: it relays a listener of its own to the
// machine and dials only allowed for the machine.
type server struct {
	relay  chan string // the relay's address, once a tunnel is up
	closed chan string // why each tunnel ended
}

func startServer(t *testing.T, allowed string) (*httptest.Server, *server) {
	t.Helper()
	return startServerTLS(t, allowed, false)
}

// startServerTLS is startServer, over TLS with HTTP/2 offered by ALPN (as
// the admin API does) when tlsOn.
func startServerTLS(t *testing.T, allowed string, tlsOn bool) (*httptest.Server, *server) {
	t.Helper()
	s := &server{relay: make(chan string, 4), closed: make(chan string, 4)}
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer secret" {
			http.Error(w, `{"error":{"code":"unauthorized"}}`, http.StatusUnauthorized)
			return
		}
		rl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Error(err)
			return
		}
		ts, err := Upgrade(w, r)
		if err != nil {
			rl.Close()
			t.Error(err)
			return
		}
		defer ts.Close()
		ts.Relay(rl, RelayOptions{Name: "test relay", MaxConns: 4})
		ts.Serve(func(ctx context.Context, req string) (net.Conn, error) {
			if req != "dial "+allowed {
				return nil, fmt.Errorf("%q is not allowed", req)
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", allowed)
		})
		ended := ts.Ended()
		if err := ts.SendHello(Hello{Service: "web", Addr: rl.Addr().String()}); err != nil {
			t.Error(err)
			return
		}
		s.relay <- rl.Addr().String()
		why := ""
		select {
		case <-ended:
			why = "ended"
		case <-ts.Done():
			why = "dropped"
		}
		ts.Goodbye()
		ts.Close() // waits for the relay's listener to close
		s.closed <- why
	}))
	if tlsOn {
		hs.EnableHTTP2 = true
		hs.StartTLS()
	} else {
		hs.Start()
	}
	t.Cleanup(hs.Close)
	return hs, s
}

// serveLocal relays the tunnel's connections to the local listener.
func serveLocal(c *Client, local string) chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			st, err := c.Accept()
			if err != nil {
				return
			}
			go func() {
				lc, err := net.Dial("tcp", local)
				if err != nil {
					st.Close()
					return
				}
				Pipe(st, lc)
			}()
		}
	}()
	return done
}

// TestBothWays relays a connection from the control plane's side to the
// machine's process, and a connection from the machine to an allowed
// address; a request for any other address is refused with its reason;
// Close ends the tunnel with the control plane's word.
func TestBothWays(t *testing.T) {
	laptop := echo(t, "laptop")
	envSvc := echo(t, "env")
	hs, s := startServer(t, envSvc.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, hs.URL, "secret", "service=web", nil)
	if err != nil {
		t.Fatal(err)
	}
	done := serveLocal(c, laptop.Addr().String())
	relay := <-s.relay
	if c.Hello.Addr != relay {
		t.Errorf("Hello.Addr %q, want the relay %q", c.Hello.Addr, relay)
	}

	in, err := net.Dial("tcp", relay)
	if err != nil {
		t.Fatal(err)
	}
	if got := roundTrip(t, in, "hello"); got != "laptop: hello" {
		t.Errorf("inbound: %q, want the laptop's echo", got)
	}
	in.Close()

	out, err := c.Open(ctx, "dial "+envSvc.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if got := roundTrip(t, out, "hi"); got != "env: hi" {
		t.Errorf("outbound: %q, want the environment's echo", got)
	}
	out.Close()
	if _, err := c.Open(ctx, "dial 10.0.0.1:80"); err == nil || !strings.Contains(err.Error(), "not allowed") {
		t.Errorf("a dial to another address: %v, want the control plane's refusal", err)
	}
	if !c.Close(5 * time.Second) {
		t.Error("Close: the control plane did not confirm")
	}
	<-done
	if why := <-s.closed; why != "ended" {
		t.Errorf("the server saw the tunnel %s, want ended", why)
	}
}

// TestRelayRefusesWithoutTunnel: once the tunnel's connection ends, the
// relay refuses connections at once, so that a caller moves on.
func TestRelayRefusesWithoutTunnel(t *testing.T) {
	laptop := echo(t, "laptop")
	hs, s := startServer(t, "")
	c, relay, done := dialLocal(t, hs, s, laptop.Addr().String())
	if why := drop(c, done, s); why != "dropped" {
		t.Errorf("the server saw the tunnel %s, want dropped", why)
	}
	_, err := net.DialTimeout("tcp", relay, 5*time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a connection to the relay of a dropped tunnel: %v, want refused", err)
	}
}

// TestDialRefused: an upgrade the server refuses comes back with its status
// and body.
func TestDialRefused(t *testing.T) {
	hs, _ := startServer(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := Dial(ctx, hs.URL, "wrong", "", nil)
	var he *HandshakeError
	if !errors.As(err, &he) || he.Status != http.StatusUnauthorized || !strings.Contains(string(he.Body), "unauthorized") {
		t.Fatalf("Dial with a wrong token: %v, want a HandshakeError with 401 and the body", err)
	}
}

// TestOverTLS: a tunnel to an admin API that serves TLS and offers HTTP/2
// by ALPN, with HTTPClient (which asks for HTTP/1.1, the upgrade's).
func TestOverTLS(t *testing.T) {
	laptop := echo(t, "laptop")
	hs, s := startServerTLS(t, "", true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hc := HTTPClient(hs.Client().Transport.(*http.Transport).TLSClientConfig)
	defer hc.CloseIdleConnections()
	c, err := Dial(ctx, hs.URL, "secret", "", hc)
	if err != nil {
		t.Fatal(err)
	}
	done := serveLocal(c, laptop.Addr().String())
	in, err := net.Dial("tcp", <-s.relay)
	if err != nil {
		t.Fatal(err)
	}
	if got := roundTrip(t, in, "over tls"); got != "laptop: over tls" {
		t.Errorf("inbound over TLS: %q", got)
	}
	in.Close()
	if !c.Close(5 * time.Second) {
		t.Error("Close: the control plane did not confirm")
	}
	<-done
	<-s.closed
}

// TestCloseEndsRelayedConns: a relayed connection that the machine's side
// has closed (its write half ended) while the caller keeps its own open, as
// an idle keep-alive connection does, ends with the tunnel: Close does not
// wait for the caller.
func TestCloseEndsRelayedConns(t *testing.T) {
	laptop, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { // says bye and closes: the machine's side ends first
		defer close(served)
		c, err := laptop.Accept()
		if err != nil {
			return
		}
		io.WriteString(c, "bye\n")
		c.Close()
	}()
	defer func() { laptop.Close(); <-served }()
	hs, s := startServer(t, "")
	c, relay, done := dialLocal(t, hs, s, laptop.Addr().String())
	in, err := net.Dial("tcp", relay)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close() // kept open until the test ends
	in.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(in)
	if line, err := br.ReadString('\n'); line != "bye\n" || err != nil {
		t.Fatalf("read %q, %v", line, err)
	}
	if _, err := br.ReadByte(); err != io.EOF { // the machine's side has ended
		t.Fatalf("after bye: %v, want EOF", err)
	}
	ended := make(chan string, 1)
	go func() { ended <- drop(c, done, s) }()
	select {
	case why := <-ended:
		if why != "dropped" {
			t.Errorf("the server saw the tunnel %s, want dropped", why)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server's Close waits on a relayed connection that its caller keeps open")
	}
}

// dialLocal opens a tunnel to hs (served by s) whose relayed connections
// reach local; it returns the client, the relay's address, and the channel
// closed when the relaying ends.
func dialLocal(t *testing.T, hs *httptest.Server, s *server, local string) (*Client, string, chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, hs.URL, "secret", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	done := serveLocal(c, local)
	return c, <-s.relay, done
}

// drop ends c's tunnel as a lost connection does (not Close), and returns
// how the server saw the tunnel end.
func drop(c *Client, done chan struct{}, s *server) string {
	c.sess.Close()
	c.cancel()
	<-done
	return <-s.closed
}

// TestDropEndsMachineSide: on the machine's side too, a relayed connection
// ends with the tunnel, although its local peer keeps its end open after
// the caller's side has ended.
func TestDropEndsMachineSide(t *testing.T) {
	local, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	release, read := make(chan struct{}), make(chan struct{})
	served := make(chan struct{})
	go func() { // reads the request to its end, then keeps the connection open, idle
		defer close(served)
		c, err := local.Accept()
		if err != nil {
			return
		}
		io.Copy(io.Discard, c)
		close(read)
		<-release
		c.Close()
	}()
	defer func() { close(release); local.Close(); <-served }()
	hs, s := startServer(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, hs.URL, "secret", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	piped := make(chan struct{})
	go func() { // the machine's relay of one connection, as serveLocal
		st, err := c.Accept()
		if err != nil {
			close(piped)
			return
		}
		lc, err := net.Dial("tcp", local.Addr().String())
		if err != nil {
			st.Close()
			close(piped)
			return
		}
		Pipe(st, lc)
		close(piped)
	}()
	in, err := net.Dial("tcp", <-s.relay)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	io.WriteString(in, "hi\n")
	in.(*net.TCPConn).CloseWrite() // the caller's side ends; the local peer's stays open
	select {
	case <-read:
	case <-time.After(10 * time.Second):
		t.Fatal("the caller's end did not reach the local peer")
	}
	c.sess.Close() // dropped
	c.cancel()
	<-s.closed
	select {
	case <-piped:
	case <-time.After(10 * time.Second):
		t.Fatal("the machine's relay waits on a local connection after the tunnel dropped")
	}
}
