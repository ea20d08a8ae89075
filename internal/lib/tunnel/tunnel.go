// Package tunnel is the wire of `lanes dev`'s tunnel, written once for both
// ends: one outbound connection from a developer's machine to the admin API
// of `lanes up`, over which the control plane relays the connections that
// reach a lane instance to the machine (inbound), and the machine reaches the
// environment's instances and NATS (outbound).
//
// The connection is a WebSocket (RFC 6455) on the admin API's own port, at
// Path, authenticated by the bearer token of the upgrade request, and
// multiplexed by yamux: each relayed or dialled connection is a yamux stream
// with its own flow-control window.
//
// Why these two: a WebSocket is the one upgrade that HTTP proxies and
// TLS-terminating load balancers commonly pass through (a bespoke
// "Upgrade: lanes-tunnel" is dropped by many, an HTTP/2 stream is not
// available through most), and github.com/coder/websocket turns one into a
// net.Conn with no other dependency. yamux (github.com/hashicorp/yamux) is a
// small, long-kept multiplexer with per-stream flow control (the bound on
// the bytes in flight), stream open timeouts and keep-alive pings that
// detect a silent drop; HTTP/2 as the multiplexer would frame HTTP inside
// HTTP and could not carry plain TCP both ways without a protocol of our
// own on top.
//
// Streams. The control plane opens one stream per connection that reaches
// the tunnel's relay listener; the machine pipes it to its local process.
// The machine opens streams that start with one request line, answered with
// one line ("ok" or "error <message>"), after which the stream is the
// connection:
//
//	control               the first stream: the registration's outcome (Hello, JSON), then EOF from
//	                      the machine ends the tunnel, answered by "deregistered"
//	dial <host:port>      a connection to an instance of the environment
//	nats                  a connection to the environment's NATS server
package tunnel

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/lanesdev/lanes/registry"
)

// Describe says where an instance with labels really runs, when the control
// plane registered it for a tunnel ("through a tunnel from 203.0.113.7
// since 2026-12-07T02:49:33Z"); "" otherwise.
func Describe(labels map[string]string) string {
	if labels[registry.LabelPath] != registry.PathTunnel || labels[registry.LabelTunnelFrom] == "" {
		return ""
	}
	return "through a tunnel from " + labels[registry.LabelTunnelFrom] + " since " + labels[registry.LabelTunnelSince]
}

// Path is the admin API's endpoint of the tunnel.
const Path = "/v1/tunnel"

// Subprotocol is the WebSocket subprotocol that both ends speak.
const Subprotocol = "lanes-tunnel.v1"

// Bounds of a tunnel.
const (
	// Window is the flow-control window of a stream: the most bytes in
	// flight on one relayed connection in each direction.
	Window = 256 << 10
	// MaxStreams is the most connections open at once through one tunnel
	// in each direction. With Window, it bounds the bytes a tunnel holds:
	// MaxStreams × Window per direction.
	MaxStreams = 256
	// KeepAlive is how often each end pings the other; a ping unanswered
	// within WriteTimeout ends the tunnel, so a silent drop is found within
	// KeepAlive + WriteTimeout.
	KeepAlive = time.Second
	// WriteTimeout bounds a write to the tunnel's connection and a ping's
	// answer.
	WriteTimeout = 3 * time.Second
	// OpenTimeout bounds the opening of a stream.
	OpenTimeout = 3 * time.Second
	// maxMessage bounds a WebSocket message (a yamux frame is at most a
	// window and its header).
	maxMessage = Window + 64<<10
	// maxLine bounds a stream's request or answer line.
	maxLine = 1 << 10
)

// MaxMessage is the read limit of the WebSocket: a yamux frame and more.
const MaxMessage = maxMessage

// Config is the yamux configuration of both ends.
func Config() *yamux.Config {
	c := yamux.DefaultConfig()
	c.AcceptBacklog = MaxStreams
	c.EnableKeepAlive = true
	c.KeepAliveInterval = KeepAlive
	c.ConnectionWriteTimeout = WriteTimeout
	c.MaxStreamWindowSize = Window
	c.StreamOpenTimeout = OpenTimeout
	c.StreamCloseTimeout = 30 * time.Second
	c.LogOutput = io.Discard
	return c
}

// Hello is the control plane's first word on the control stream: the
// registration it made for the tunnel, or why it made none.
type Hello struct {
	Service      string `json:"service,omitempty"`
	ID           string `json:"id,omitempty"`
	Lane         string `json:"lane,omitempty"`
	Addr         string `json:"addr,omitempty"` // the relay's address, registered
	Registration string `json:"registration,omitempty"`
	From         string `json:"from,omitempty"` // the machine's address as the control plane sees it
	NATS         bool   `json:"nats,omitempty"` // the control plane forwards the nats stream
	Error        string `json:"error,omitempty"`
}

// Request writes a stream's request line.
func Request(w io.Writer, line string) error {
	_, err := io.WriteString(w, line+"\n")
	return err
}

// ReadLine reads one line of at most maxLine bytes from br.
func ReadLine(br *bufio.Reader) (string, error) {
	var b []byte
	for {
		chunk, isPrefix, err := br.ReadLine()
		if err != nil {
			return "", err
		}
		b = append(b, chunk...)
		if len(b) > maxLine {
			return "", fmt.Errorf("tunnel: line longer than %d bytes", maxLine)
		}
		if !isPrefix {
			return string(b), nil
		}
	}
}

// Answer reads the answer line of a request: nil for "ok", the error the
// other end gave otherwise.
func Answer(br *bufio.Reader) error {
	line, err := ReadLine(br)
	if err != nil {
		return err
	}
	if line == "ok" {
		return nil
	}
	msg, _ := strings.CutPrefix(line, "error ")
	return errors.New(msg)
}

// Refuse writes an error answer, on one line.
func Refuse(w io.Writer, err error) {
	io.WriteString(w, "error "+strings.ReplaceAll(err.Error(), "\n", " ")+"\n")
}

// Accept writes the answer "ok".
func Accept(w io.Writer) error { return Request(w, "ok") }

// bufConn is a net.Conn whose reads go through the bufio.Reader that read
// its request or answer line.
type bufConn struct {
	net.Conn
	br *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.br.Read(p) }

// Unwrap returns the connection c reads through its buffer.
func (c *bufConn) Unwrap() net.Conn { return c.Conn }

// sessionOf returns the tunnel of c, when c is a tunnel's stream or wraps
// one (a connection with an Unwrap() net.Conn method), else nil.
func sessionOf(c net.Conn) *yamux.Session {
	for range 8 { // a bound on wrappers: they are few
		switch v := c.(type) {
		case *yamux.Stream:
			return v.Session()
		case interface{ Unwrap() net.Conn }:
			c = v.Unwrap()
		default:
			return nil
		}
	}
	return nil
}

// Buffered returns c reading through br.
func Buffered(c net.Conn, br *bufio.Reader) net.Conn {
	if br.Buffered() == 0 {
		return c
	}
	return &bufConn{Conn: c, br: br}
}

// halfCloser is a connection whose write side closes alone.
type halfCloser interface{ CloseWrite() error }

// Pipe copies a to b and b to a until both directions end, closing the
// write side of each as its source ends, then closes both. It returns the
// bytes copied each way. When a or b is a tunnel's stream (see sessionOf),
// the tunnel's end closes both at once: the other side's peer may keep its
// end open (an idle keep-alive connection, after the stream's side ended),
// and nothing must wait on a tunnel that has ended.
func Pipe(a, b net.Conn) (ab, ba int64) {
	sess := sessionOf(a)
	if sess == nil {
		sess = sessionOf(b)
	}
	if sess != nil {
		piped := make(chan struct{})
		defer close(piped)
		go func() { // ends with the pipe
			select {
			case <-sess.CloseChan():
				a.Close()
				b.Close()
			case <-piped:
			}
		}()
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ba = copyHalf(a, b)
	}()
	ab = copyHalf(b, a)
	wg.Wait()
	a.Close()
	b.Close()
	return ab, ba
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copyHalf copies src to dst and then closes dst's write side (all of dst
// when it has none, which ends the other direction too).
func copyHalf(dst, src net.Conn) int64 {
	buf := copyBufs.Get().(*[]byte)
	n, err := io.CopyBuffer(dst, src, *buf)
	copyBufs.Put(buf)
	hc, ok := dst.(halfCloser)
	if u, isWrapped := dst.(interface{ NetConn() net.Conn }); !ok && isWrapped {
		hc, ok = u.NetConn().(halfCloser)
	}
	if ok && err == nil {
		hc.CloseWrite()
	} else if ok {
		dst.Close()
		src.Close()
	} else {
		// A yamux stream's Close is a half close (FIN); the other
		// direction goes on until the peer closes too.
		dst.Close()
		if err != nil {
			src.Close()
		}
	}
	return n
}

// ServeConnect serves one connection of the machine's dial proxy
// (LANES_DIAL): an HTTP CONNECT host:port, answered 200 and piped to what
// open returns for the address, or 502 with open's error. Any other request
// is answered 405. timeout bounds the request and its answer.
func ServeConnect(c net.Conn, timeout time.Duration, open func(addr string) (net.Conn, error)) {
	c.SetDeadline(time.Now().Add(timeout))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		c.Close()
		return
	}
	if req.Method != http.MethodConnect {
		io.WriteString(c, "HTTP/1.1 405 Method Not Allowed\r\nConnection: close\r\nContent-Type: text/plain\r\n\r\nlanes dev: this proxy takes CONNECT host:port to an instance (LANES_DIAL)\n")
		c.Close()
		return
	}
	st, err := open(req.Host)
	if err != nil {
		msg := strings.ReplaceAll(err.Error(), "\n", " ")
		fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(msg), msg)
		c.Close()
		return
	}
	if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\n"); err != nil {
		c.Close()
		st.Close()
		return
	}
	c.SetDeadline(time.Time{})
	Pipe(Buffered(c, br), st)
}

// Dialable reports whether a tunnel's machine may reach addr ("dial
// host:port"): only the address of a registered instance, of any service
// and lane (the machine's calls are routed by its own engine, and a lane
// that falls back to the machine's sends calls in its own lane). The
// control plane's listeners stay out of reach by the address rules of the
// dialer. A tunnel is no way into the environment's network beyond its
// instances.
func Dialable(addr string, instances []registry.Instance) bool {
	for i := range instances {
		if instances[i].Addr == addr {
			return true
		}
	}
	return false
}
