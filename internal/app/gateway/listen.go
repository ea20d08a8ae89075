package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/lanesdev/lanes/internal/lib/accept"
	"github.com/lanesdev/lanes/internal/lib/netbound"
)

// h2Preface opens every HTTP/2 connection with prior knowledge (h2c, gRPC).
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// fastServer is one Serve call of the fast path: its listener, the HTTP/1.1
// connections it serves on fasthttp, and the listener that hands HTTP/2
// connections to a net/http server.
type fastServer struct {
	ln    net.Listener
	h2    *chanListener
	fs    *fasthttp.Server
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup // the connection goroutines
	// clientWrite is the client write timeout, 0 for none.
	clientWrite time.Duration
	// headTimeout is the client header timeout.
	headTimeout time.Duration
}

// bodyTimeout is fasthttp's HeaderReceived: once a head is in, its body
// may take readTimeout (the head took at most the client header timeout).
func bodyTimeout(*fasthttp.RequestHeader) fasthttp.RequestConfig {
	return fasthttp.RequestConfig{ReadTimeout: readTimeout}
}

// shedAnswer is the answer to a connection over the cap of max: written at
// once, before the request is read, and the connection closed.
func shedAnswer(max int) []byte {
	return accept.Answer(hError+": "+codeOverloaded+"\r\n",
		fmt.Sprintf("lanes: the gateway is at its limit of %d open connections (max_conns); try again\n", max))
}

// shed answers a connection over Config.MaxConns (accept.Options.Shed).
func (g *Gateway) shed(c net.Conn) { c.Write(g.shedAnswer) }

// serveFast is Serve on the fast path: it accepts connections on ln, hands
// those that open with the HTTP/2 preface to a net/http server (h2c and
// gRPC, as the net/http path serves them) and serves the others on
// fasthttp, each on its own goroutine, until Close or Shutdown.
func (g *Gateway) serveFast(ln net.Listener) error {
	s := &fastServer{headTimeout: g.clientHeader, ln: ln, h2: newChanListener(ln.Addr()), conns: map[net.Conn]struct{}{}, clientWrite: g.clientWrite}
	s.fs = &fasthttp.Server{
		Handler:                      g.fastPath.serve,
		Name:                         "",
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		NoDefaultDate:                true,
		DisablePreParseMultipartForm: true,
		ReadBufferSize:               maxHeaderBytes, // fasthttp's bound on a request head
		WriteBufferSize:              16 << 10,
		// ReadTimeout bounds the read of a head (the first request's
		// from where sniff started, see prefixConn.headBy); once it is
		// in, HeaderReceived gives the body readTimeout.
		ReadTimeout:    g.clientHeader,
		HeaderReceived: bodyTimeout,
		IdleTimeout:    g.clientIdle,
		// Request bodies stream: the handler runs once the head is in
		// (fastPath.takeBody); with streaming, MaxRequestBodySize is no
		// limit, only how much of a body fasthttp may read with the head.
		StreamRequestBody:  true,
		MaxRequestBodySize: bufferedRequestBody,
		ErrorHandler:       g.refuse,
		Logger:             fastLogger{g.log},
	}
	if !g.register(ln, func() {
		g.fastSrv[s] = struct{}{}
		g.up.startSweeper() // Close stops it
	}) {
		return http.ErrServerClosed
	}

	h2done := make(chan struct{})
	go func() {
		defer close(h2done)
		g.serveStd(s.h2)
	}()
	// ln backs off on temporary errors (Serve wrapped it): any error
	// ends the loop.
	var err error
	for {
		c, aerr := ln.Accept()
		if aerr != nil {
			err = aerr
			break
		}
		if !s.track(c) {
			c.Close()
			continue
		}
		s.wg.Add(1)
		go s.serveConn(c)
	}
	s.h2.Close()
	<-h2done
	s.closeConns()
	s.wg.Wait()
	g.mu.Lock()
	delete(g.fastSrv, s)
	g.mu.Unlock()
	if g.closing.Load() {
		return http.ErrServerClosed
	}
	return err
}

// maxHeaderBytes bounds a request head (the request line and the header
// fields, with their line ends) on both HTTP/1.1 paths. fasthttp's server
// bounds a head by its read buffer, which is this size, and answers 431 to
// a longer one. net/http's server counts a head from where its 4 KiB read
// buffer stands and lets it run MaxHeaderBytes and 4 KiB more (its "bufio
// slop"); with MaxHeaderBytes at stdMaxHeaderBytes it takes every head of
// up to maxHeaderBytes too, and answers 431 to those over it by more than
// what it had read ahead (the buffer's 4 KiB at most: on a new connection
// it reads ahead to look for the HTTP/2 preface).
const maxHeaderBytes = 16 << 10

// stdHeaderSlack is what net/http's server adds to MaxHeaderBytes.
const stdHeaderSlack = 4 << 10

// stdMaxHeaderBytes is net/http's Server.MaxHeaderBytes: HTTP/2's header
// list limit, which net/http derives from it, is then about 12 KiB.
const stdMaxHeaderBytes = maxHeaderBytes - stdHeaderSlack

func (s *fastServer) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conns == nil {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *fastServer) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// closeConns closes every connection and refuses new ones.
func (s *fastServer) closeConns() {
	s.mu.Lock()
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	for c := range conns {
		c.Close()
	}
}

// stop ends Serve: the listener, then the connections.
func (s *fastServer) stop() {
	s.ln.Close()
	s.closeConns()
}

// serveConn sniffs c's first bytes and serves it.
func (s *fastServer) serveConn(c net.Conn) {
	defer s.wg.Done()
	pc, h2, err := sniff(c, s.headTimeout)
	if err != nil {
		s.untrack(c)
		c.Close()
		return
	}
	pc.w = netbound.Writer{C: c, D: s.clientWrite, Names: clientWrites}
	if h2 {
		// The net/http server owns the connection from here; Close
		// closes it through that server.
		s.untrack(c)
		s.h2.push(pc)
		return
	}
	// ServeConn closes pc, unless a request hijacked it (an upgrade):
	// then whoever holds it does. Either way pc leaves the set when closed.
	pc.s = s
	s.fs.ServeConn(pc)
}

// sniff reads the first bytes of c, within the head timeout d, until they
// are the HTTP/2 preface or cannot be, and returns c with them to be read
// again. An HTTP/1.1 connection keeps the deadline for the rest of its
// first head (prefixConn.headBy).
func sniff(c net.Conn, d time.Duration) (*prefixConn, bool, error) {
	headBy := time.Now().Add(d)
	c.SetReadDeadline(headBy)
	var buf [len(h2Preface)]byte
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if string(buf[:n]) != h2Preface[:n] {
			break
		}
		if err != nil {
			if n == 0 {
				return nil, false, err
			}
			break
		}
	}
	h2 := n == len(h2Preface) && string(buf[:n]) == h2Preface
	pc := &prefixConn{Conn: c}
	if h2 {
		c.SetReadDeadline(time.Time{}) // net/http's server sets its own
	} else {
		pc.headBy = headBy
	}
	pc.prefix = append(pc.buf[:0], buf[:n]...)
	return pc, h2, nil
}

// prefixConn is a connection whose first bytes, already read, are read
// again.
type prefixConn struct {
	net.Conn
	prefix []byte
	buf    [len(h2Preface)]byte
	s      *fastServer // untracks the connection when closed
	armed  time.Time   // the read deadline set, on fasthttp's connections
	// linger has Close end the connection as net/http's server ends one
	// whose request body it did not read through (see lingerClose).
	linger bool
	// w bounds each write of an answer by the client write timeout.
	w netbound.Writer
	// headBy is the deadline of the first request's head, set when the
	// connection opened (sniff): fasthttp's first deadline, its read
	// timeout counted from when it starts, keeps it, so that the head
	// takes the client header timeout in all.
	headBy time.Time
}

// Write writes to the client, each write within the client write timeout.
func (c *prefixConn) Write(p []byte) (int, error) { return c.w.Write(p) }

// clientListener hands the net/http path's server its connections as
// netbound.Conns: each write within the client write timeout.
type clientListener struct {
	net.Listener
	d time.Duration
}

func (l clientListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return netbound.NewConn(c, l.d, clientWrites), nil
}

// SetReadDeadline sets the read deadline, but on fasthttp's connections keeps
// one already set that falls at most a second before t: fasthttp sets two
// each request (the idle timeout, then the read timeout, both minutes long),
// and setting one is a runtime timer update. Its timeouts thus last up to a
// second less than configured, never more.
func (c *prefixConn) SetReadDeadline(t time.Time) error {
	if !c.headBy.IsZero() {
		by := c.headBy
		c.headBy = time.Time{}
		if !t.IsZero() && t.After(by) {
			c.armed = by
			return nil
		}
	}
	if c.s != nil && !t.IsZero() && !c.armed.IsZero() && !c.armed.After(t) && t.Sub(c.armed) <= time.Second {
		return nil
	}
	err := c.Conn.SetReadDeadline(t)
	if c.s != nil {
		c.armed = t
	}
	return err
}

// SetDeadline sets both deadlines, as net.Conn's does.
func (c *prefixConn) SetDeadline(t time.Time) error {
	if c.s != nil {
		c.armed = t
	}
	return c.Conn.SetDeadline(t)
}

func (c *prefixConn) Close() error {
	if c.linger {
		c.linger = false
		if tc := tcpConn(c.Conn); tc != nil {
			// Still tracked: the gateway's Close ends the wait.
			tc.CloseWrite()
			tc.SetReadDeadline(time.Now().Add(lingerTimeout))
			io.Copy(io.Discard, tc)
		}
	}
	if c.s != nil {
		c.s.untrack(c.Conn)
	}
	return c.Conn.Close()
}

// reset has the client's connection c end with a TCP reset when it closes
// (SO_LINGER 0) rather than with the orderly end that follows a whole
// answer: the end of an answer that was cut short (the instance failed
// mid-answer), which a client that reads the answer to the end of the
// connection (an HTTP/1.0 answer without a length, on both paths) would
// otherwise take for the whole of it. Bytes not yet sent are dropped, which
// a cut answer may lose. A connection that is not TCP underneath ends as
// it would have.
func reset(c net.Conn) {
	for pc, ok := c.(*prefixConn); ok; pc, ok = c.(*prefixConn) {
		pc.linger = false
		c = pc.Conn
	}
	if tc := tcpConn(c); tc != nil {
		tc.SetLinger(0)
	}
}

// tcpConn is the TCP connection under the client's connection c, nil when
// it is not TCP underneath.
func tcpConn(c net.Conn) *net.TCPConn {
	for {
		switch x := c.(type) {
		case *prefixConn:
			c = x.Conn
		case *netbound.Conn:
			c = x.Conn
		case *accept.Conn:
			c = x.Conn
		case *tls.Conn:
			c = x.NetConn()
		case *net.TCPConn:
			return x
		default:
			return nil
		}
	}
}

// readTimeout bounds the read of a request on the fast path: its head and
// a small body; a body that streams gets as long again for each of its
// reads (keptBody.conn), so that an upload lasts as long as it keeps
// coming.
const readTimeout = 2 * time.Minute

// lingerTimeout bounds how long a connection closed with its request body
// unread waits for the client to stop sending (as net/http's server waits
// 500ms).
const lingerTimeout = 500 * time.Millisecond

// lingerClose closes the connection of ctx after the answer, which is sent
// before all of the request's body was read (the instance answered early,
// or failed): it closes its side first and reads what the client still
// sends, for up to lingerTimeout or until the client closes, so that the
// connection does not reset under the answer before the client reads it.
func lingerClose(ctx *fasthttp.RequestCtx) {
	ctx.SetConnectionClose()
	if pc, ok := ctx.Conn().(*prefixConn); ok && pc.s != nil {
		pc.linger = true
	}
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// chanListener is a net.Listener of the connections that sniff hands over.
type chanListener struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newChanListener(a net.Addr) *chanListener {
	return &chanListener{addr: a, ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) push(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *chanListener) Addr() net.Addr { return l.addr }

// refuse answers a request that fasthttp's server refused before the
// handler ran (a head it cannot parse or that is too long, a body that
// breaks its framing, a timeout) with the gateway's error
// (Gateway.fail: x-lanes-error and a text body), and the status net/http's
// server, or the std path's handler, gives the same bytes. fasthttp closes
// the connection after it.
func (g *Gateway) refuse(ctx *fasthttp.RequestCtx, err error) {
	status, code, msg := refusal(err)
	g.m.errors(code)
	g.fail((*fastOut)(ctx), false, status, code, msg)
}

// refusal is the status, x-lanes-error code and message of a request that
// fasthttp's server refused with err.
func refusal(err error) (status int, code, msg string) {
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.As(err, &small):
		return http.StatusRequestHeaderFieldsTooLarge, codeHeadTooLarge,
			fmt.Sprintf("lanes: the request head is over %d bytes", maxHeaderBytes)
	case errors.Is(err, fasthttp.ErrTimeout) || errors.As(err, &ne) && ne.Timeout():
		return http.StatusRequestTimeout, codeTimeout, "lanes: timed out reading the request"
	case headRefused(err):
		return http.StatusBadRequest, codeBadRequest, "lanes: malformed request"
	}
	return http.StatusBadRequest, codeBadBody, "lanes: reading the request body: " + err.Error()
}

// headRefused reports whether fasthttp's server refused a request's head
// with err, rather than its body: it wraps every error of a head it cannot
// parse as "error when reading request headers: ...", refuses a bad Host
// or target with ErrorInvalidURI, and an absolute-form target's scheme
// with "invalid scheme ...". The body's errors (a bad chunk size, a body
// shorter than its Content-Length) have no type to tell them by, and the
// server resets the request, head included, on any error.
func headRefused(err error) bool {
	m := err.Error()
	return errors.Is(err, fasthttp.ErrorInvalidURI) ||
		strings.HasPrefix(m, "error when reading request headers") || strings.HasPrefix(m, "invalid scheme")
}

// fastLogger sends fasthttp's messages to the gateway's logger.
type fastLogger struct{ log *slog.Logger }

func (l fastLogger) Printf(format string, args ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug("lanes gateway: fasthttp", "msg", fmt.Sprintf(format, args...))
	}
}
