package tunnel

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/yamux"

	"github.com/lanesdev/lanes/internal/lib/accept"
	"github.com/lanesdev/lanes/lane"
)

// Client is the machine's end of a tunnel.
type Client struct {
	// Hello is the control plane's registration of the tunnel.
	Hello Hello

	sess    *yamux.Session
	control net.Conn
	br      *bufio.Reader
	cancel  context.CancelFunc
}

// HandshakeError is an answer other than the upgrade to the tunnel's
// request: its status and body (the admin API's error document).
type HandshakeError struct {
	Status int
	Body   []byte
	Err    error
}

func (e *HandshakeError) Error() string {
	if e.Status == 0 {
		return e.Err.Error()
	}
	return fmt.Sprintf("HTTP %d: %s", e.Status, strings.TrimSpace(string(e.Body)))
}

func (e *HandshakeError) Unwrap() error { return e.Err }

// HTTPClient returns the client that opens tunnels: Go's default transport
// (with the proxy of HTTPS_PROXY or HTTP_PROXY), tc for TLS (nil: the
// system's roots), and HTTP/1.1 asked for by ALPN, since the upgrade is
// HTTP/1.1's and the admin API offers HTTP/2 over TLS too.
func HTTPClient(tc *tls.Config) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ForceAttemptHTTP2 = false
	if tc == nil {
		tc = &tls.Config{}
	} else {
		tc = tc.Clone()
	}
	tc.NextProtos = []string{"http/1.1"}
	tr.TLSClientConfig = tc
	return &http.Client{Transport: tr} //lanes:ignore the tunnel goes to the admin API, the control plane, not a service in a lane
}

// Dial opens a tunnel: the WebSocket upgrade of GET <admin>/v1/tunnel?<q>
// with the token, yamux over it, and the control stream's Hello. hc sends
// the upgrade (its Transport must be an *http.Transport or return writable
// bodies); nil is http.DefaultClient. ctx bounds the opening only.
func Dial(ctx context.Context, admin, token string, q string, hc *http.Client) (*Client, error) {
	h := http.Header{}
	h.Set("Authorization", "Bearer "+token)
	ws, resp, err := websocket.Dial(ctx, strings.TrimSuffix(admin, "/")+Path+"?"+q, &websocket.DialOptions{
		HTTPClient: hc, HTTPHeader: h, Subprotocols: []string{Subprotocol}})
	if err != nil {
		he := &HandshakeError{Err: err}
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			he.Status = resp.StatusCode
			if resp.Body != nil {
				he.Body, _ = io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			}
		}
		return nil, he
	}
	ws.SetReadLimit(MaxMessage)
	lctx, cancel := context.WithCancel(context.Background())
	nc := websocket.NetConn(lctx, ws, websocket.MessageBinary)
	sess, err := yamux.Client(nc, Config())
	if err != nil {
		cancel()
		nc.Close()
		return nil, err
	}
	c := &Client{sess: sess, cancel: cancel}
	fail := func(err error) (*Client, error) {
		sess.Close()
		cancel()
		return nil, err
	}
	st, err := sess.OpenStream()
	if err != nil {
		return fail(err)
	}
	c.control, c.br = st, bufio.NewReader(st)
	if dl, ok := ctx.Deadline(); ok {
		st.SetDeadline(dl)
	}
	if err := Request(st, "control"); err != nil {
		return fail(err)
	}
	line, err := ReadLine(c.br)
	if err != nil {
		return fail(fmt.Errorf("tunnel: no registration from the control plane: %w", err))
	}
	if err := json.Unmarshal([]byte(line), &c.Hello); err != nil {
		return fail(fmt.Errorf("tunnel: the control plane's registration: %w", err))
	}
	if c.Hello.Error != "" {
		return fail(errors.New(c.Hello.Error))
	}
	st.SetDeadline(time.Time{})
	return c, nil
}

// Open opens a stream for request (such as "dial 10.0.0.7:8080" or
// "nats"), and returns it once the control plane accepted it.
func (c *Client) Open(ctx context.Context, request string) (net.Conn, error) {
	st, err := c.sess.OpenStream()
	if err != nil {
		return nil, err
	}
	dl, ok := ctx.Deadline()
	if !ok || time.Until(dl) > OpenTimeout+WriteTimeout {
		dl = time.Now().Add(OpenTimeout + WriteTimeout)
	}
	st.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	br := bufio.NewReaderSize(st, 256)
	if err := Request(st, request); err != nil {
		st.Close()
		return nil, err
	}
	if err := Answer(br); err != nil {
		st.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if !stop() {
		st.Close()
		return nil, ctx.Err()
	}
	st.SetDeadline(time.Time{})
	return Buffered(st, br), nil
}

// Accept returns the next connection that the control plane relays to the
// machine.
func (c *Client) Accept() (net.Conn, error) { return c.sess.AcceptStream() }

// Done is closed when the tunnel ends.
func (c *Client) Done() <-chan struct{} { return c.sess.CloseChan() }

// RTT measures the round trip of the tunnel (a yamux ping).
func (c *Client) RTT() (time.Duration, error) { return c.sess.Ping() }

// Streams is the number of streams open.
func (c *Client) Streams() int { return c.sess.NumStreams() }

// Close ends the tunnel: it tells the control plane, which deregisters the
// instance and says so (within timeout), then closes the connection. It
// reports whether the control plane confirmed the deregistration.
func (c *Client) Close(timeout time.Duration) bool {
	c.control.SetDeadline(time.Now().Add(timeout))
	c.control.Close() // FIN: the end of the tunnel
	line, _ := ReadLine(c.br)
	c.sess.Close()
	c.cancel()
	return line == "deregistered"
}

// Upgrade accepts a tunnel on the admin API: the WebSocket upgrade of r,
// yamux over it, and its control stream (read up to its request). Before it
// returns, nothing is written to w; after, w is no longer usable.
func Upgrade(w http.ResponseWriter, r *http.Request) (*Server, error) {
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{Subprotocol}})
	if err != nil {
		return nil, err
	}
	if ws.Subprotocol() != Subprotocol {
		ws.Close(websocket.StatusPolicyViolation, "the subprotocol "+Subprotocol+" is required")
		return nil, fmt.Errorf("tunnel: the client did not ask for subprotocol %s", Subprotocol)
	}
	ws.SetReadLimit(MaxMessage)
	// The tunnel outlives the upgrade's request; Close ends it.
	ctx, cancel := context.WithCancel(lane.Detach(r.Context()))
	nc := websocket.NetConn(ctx, ws, websocket.MessageBinary)
	sess, err := yamux.Server(nc, Config())
	if err != nil {
		cancel()
		nc.Close()
		return nil, err
	}
	s := &Server{sess: sess, ctx: ctx, cancel: cancel}
	st, err := acceptTimeout(sess, OpenTimeout)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("tunnel: no control stream: %w", err)
	}
	st.SetDeadline(time.Now().Add(OpenTimeout))
	br := bufio.NewReaderSize(st, 256)
	if line, err := ReadLine(br); err != nil || line != "control" {
		s.Close()
		return nil, fmt.Errorf("tunnel: the first stream is not the control stream (%q, %v)", line, err)
	}
	st.SetDeadline(time.Time{})
	s.control, s.br = st, br
	return s, nil
}

func acceptTimeout(sess *yamux.Session, d time.Duration) (*yamux.Stream, error) {
	t := time.AfterFunc(d, func() { sess.Close() })
	defer t.Stop()
	return sess.AcceptStream()
}

// Server is the control plane's end of a tunnel.
type Server struct {
	sess    *yamux.Session
	control net.Conn
	br      *bufio.Reader
	ctx     context.Context // done on Close
	cancel  context.CancelFunc
	closing sync.Once
	wg      sync.WaitGroup
}

// SendHello writes the registration's outcome on the control stream.
func (s *Server) SendHello(h Hello) error {
	b, _ := json.Marshal(h)
	s.control.SetWriteDeadline(time.Now().Add(WriteTimeout))
	_, err := s.control.Write(append(b, '\n'))
	s.control.SetWriteDeadline(time.Time{})
	return err
}

// Ended returns a channel closed when the machine ends the tunnel on its
// control stream, or the tunnel's connection ends.
func (s *Server) Ended() <-chan struct{} {
	done := make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(done)
		io.Copy(io.Discard, io.LimitReader(s.br, maxLine)) // EOF: the machine's end
	}()
	return done
}

// Done is closed when the tunnel's connection ends.
func (s *Server) Done() <-chan struct{} { return s.sess.CloseChan() }

// Goodbye tells the machine that its instance is deregistered.
func (s *Server) Goodbye() {
	s.control.SetWriteDeadline(time.Now().Add(WriteTimeout))
	Request(s.control, "deregistered")
	s.control.Close()
}

// RTT measures the round trip of the tunnel.
func (s *Server) RTT() (time.Duration, error) { return s.sess.Ping() }

// Close ends the tunnel and waits for the goroutines of Relay and Serve.
func (s *Server) Close() error {
	s.closing.Do(func() {
		s.sess.Close()
		s.cancel()
	})
	s.wg.Wait()
	return nil
}

// RelayOptions bound a tunnel's relay listener.
type RelayOptions struct {
	Name     string // the listener's name in logs
	MaxConns int    // connections open at once (MaxStreams when 0)
	Logger   *slog.Logger
	// OnConn, when set, is told of each connection relayed and its end.
	OnConn func(open bool)
}

// Relay serves ln: each connection it accepts is relayed through the tunnel
// to the machine, in a stream of its own. The accept loop backs off on
// temporary errors and caps the connections (accept.Wrap). A connection
// that the tunnel cannot take (it has ended, or the stream cannot open) is
// reset at once, so that the caller moves on. Relay owns ln; Close closes it.
func (s *Server) Relay(ln net.Listener, o RelayOptions) {
	if o.MaxConns <= 0 {
		o.MaxConns = MaxStreams
	}
	wl := ServeEach(ln, o.Name, o.MaxConns, o.Logger, &s.wg, func(c net.Conn) {
		st, err := s.sess.OpenStream()
		if err != nil {
			reset(c)
			return
		}
		if o.OnConn != nil {
			o.OnConn(true)
			defer o.OnConn(false)
		}
		Pipe(c, st)
	})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		<-s.sess.CloseChan()
		wl.Close()
	}()
}

// ServeEach serves ln with handle, a goroutine per connection, each counted
// in wg, behind the accept loop of lanes' listeners (accept.Wrap: temporary
// errors waited out, at most maxConns open). Closing the listener it
// returns ends the loop.
func ServeEach(ln net.Listener, name string, maxConns int, log *slog.Logger, wg *sync.WaitGroup, handle func(net.Conn)) net.Listener {
	wl := accept.Wrap(ln, accept.Options{Name: name, MaxConns: maxConns, Logger: log})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := wl.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				handle(c)
			}()
		}
	}()
	return wl
}

// reset closes c with a TCP reset, so that its peer hears at once.
func reset(c net.Conn) {
	if ac, ok := c.(*accept.Conn); ok {
		if tc, ok := ac.NetConn().(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
	}
	c.Close()
}

// Serve answers the streams that the machine opens with dial (each request
// line), piping each stream to the connection it returns, or refusing it
// with dial's error. It returns at once; Close waits for it.
func (s *Server) Serve(dial func(ctx context.Context, request string) (net.Conn, error)) {
	var open atomic.Int64
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			st, err := s.sess.AcceptStream()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				if open.Add(1) > MaxStreams {
					open.Add(-1)
					Refuse(st, fmt.Errorf("at most %d connections through one tunnel", MaxStreams))
					st.Close()
					return
				}
				defer open.Add(-1)
				st.SetDeadline(time.Now().Add(OpenTimeout))
				br := bufio.NewReaderSize(st, 256)
				line, err := ReadLine(br)
				if err != nil {
					st.Close()
					return
				}
				ctx, cancel := context.WithTimeout(s.ctx, OpenTimeout)
				c, err := dial(ctx, line)
				cancel()
				if err != nil {
					Refuse(st, err)
					st.Close()
					return
				}
				if err := Accept(st); err != nil {
					st.Close()
					c.Close()
					return
				}
				st.SetDeadline(time.Time{})
				Pipe(Buffered(st, br), c)
			}()
		}
	}()
}
