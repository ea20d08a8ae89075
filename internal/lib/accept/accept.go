// Package accept is the accept loop of every listener that lanes serves,
// written once: a temporary accept error backs off and the loop goes on,
// and the connections open at once are capped.
//
// A temporary accept error is one that says the process or the machine is
// short of something for a while, not that the listener is broken: EMFILE
// and ENFILE (out of file descriptors), ENOBUFS and ENOMEM (out of buffer
// memory), ECONNABORTED and ECONNRESET (a connection that ended in the
// backlog), EINTR, EAGAIN, and a timeout. Listener.Accept waits after one,
// 5 ms doubling to 1 s (internal/lib/backoff, with its jitter), as
// net/http's Server does, and accepts again; it logs the first error and then
// at most one line every 10 s, with the count since the last. Any other
// error is returned, as is net.ErrClosed once the listener is closed,
// which also ends a wait.
//
// Where a server library owns the accept loop it backs off by itself:
// net/http's Server.Serve on an error whose Temporary() is true (EMFILE,
// ENFILE, ECONNABORTED, ECONNRESET, EINTR, EAGAIN and timeouts; not
// ENOBUFS), and grpc-go's Server.Serve alike (5 ms doubling to 1 s, in
// server.go). Listener handles what either would give up on (ENOBUFS,
// ENOMEM) before the server sees it, so the servers lanes runs get its
// listener anyway, for the cap.
//
// The cap: with Options.MaxConns set, a connection accepted while that
// many are open is shed: it is counted (OnShed) and logged (at most one
// line every 10 s), and Options.Shed answers it (the gateway writes a 503
// with Connection: close) once its first bytes are in, or after ShedWait,
// on a goroutine of its own, at most MaxAnswering at once (beyond that it
// is closed at once); then it is closed. A connection counts from Accept
// until its first Close. Shedding costs a descriptor for an instant, where
// leaving new connections in the kernel's backlog would leave their
// clients waiting for nothing until their own timeout, and then fill the
// backlog.
package accept

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lanesdev/lanes/internal/lib/backoff"
)

// The backoff of Accept after a temporary error, as net/http's.
const (
	MinDelay = 5 * time.Millisecond
	MaxDelay = time.Second
)

// logEvery bounds the log lines of one kind of a listener.
const logEvery = 10 * time.Second

// ShedWriteTimeout bounds the write of Options.Shed's answer: a new
// connection's send buffer is empty, so it takes no time, unless the
// client set a tiny window.
const ShedWriteTimeout = time.Second

// ShedWait bounds the wait for a shed connection's first bytes, which its
// answer waits for.
const ShedWait = 500 * time.Millisecond

// MaxAnswering bounds the shed connections that wait for their answer at
// once (each on a goroutine, for up to ShedWait and ShedWriteTimeout); one
// shed beyond it is closed without an answer. The descriptors of a
// Listener are thus at most MaxConns and MaxAnswering.
const MaxAnswering = 64

// Options are a Listener's cap, and who hears of what it does.
type Options struct {
	// Name names the listener in its log lines: "gateway", "admin API".
	Name string
	// MaxConns caps the connections open at once; 0 or less: no cap.
	MaxConns int
	// Shed, when set, answers a connection over the cap before it is
	// closed, once the client's first bytes are in (or ShedWait passed).
	// Its writes are bounded by ShedWriteTimeout; it must not read. What
	// the client has sent by then is read and dropped without waiting, so
	// that the close does not reset the connection under the answer.
	// Without Shed, a connection over the cap is closed at once.
	Shed func(net.Conn)
	// OnShed, when set, is called for each connection shed (a counter).
	OnShed func()
	// Logger receives the warnings; default slog.Default().
	Logger *slog.Logger
}

// Listener is a net.Listener whose Accept backs off on temporary errors and
// caps the open connections. Its connections are *Conn.
type Listener struct {
	net.Listener
	o      Options
	open   atomic.Int64
	ctx    context.Context // done on Close: ends a backoff's wait
	cancel context.CancelFunc

	errLog, shedLog every
	answering       chan struct{} // a place for each shed connection being answered
	wg              sync.WaitGroup
}

// Wrap returns ln with Accept backing off on temporary errors and, with
// o.MaxConns, the open connections capped.
func Wrap(ln net.Listener, o Options) *Listener {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	l := &Listener{Listener: ln, o: o, answering: make(chan struct{}, MaxAnswering)}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l
}

// Accept waits for the next connection under the cap, and returns it.
func (l *Listener) Accept() (net.Conn, error) {
	var b *backoff.Backoff
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if l.ctx.Err() != nil {
				return nil, net.ErrClosed
			}
			if !Temporary(err) {
				return nil, err
			}
			if b == nil {
				b = backoff.New(MinDelay, MaxDelay)
			}
			if n, ok := l.errLog.note(); ok {
				l.o.Logger.Warn("lanes: accept failed; retrying", "listener", l.o.Name, "addr", l.Addr().String(),
					"err", err, "failures", n)
			}
			if !b.Wait(l.ctx) {
				return nil, net.ErrClosed
			}
			continue
		}
		if !l.take() {
			l.shed(c)
			continue
		}
		return &Conn{Conn: c, l: l}, nil
	}
}

// take counts a new connection, unless MaxConns are open.
func (l *Listener) take() bool {
	if l.o.MaxConns <= 0 {
		l.open.Add(1)
		return true
	}
	for {
		n := l.open.Load()
		if n >= int64(l.o.MaxConns) {
			return false
		}
		if l.open.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (l *Listener) shed(c net.Conn) {
	if l.o.OnShed != nil {
		l.o.OnShed() // counted before the client hears of it
	}
	if n, ok := l.shedLog.note(); ok {
		l.o.Logger.Warn("lanes: at the connection limit; shedding new connections", "listener", l.o.Name,
			"addr", l.Addr().String(), "max_conns", l.o.MaxConns, "shed", n)
	}
	if l.o.Shed == nil {
		c.Close()
		return
	}
	select {
	case l.answering <- struct{}{}:
	default: // MaxAnswering are being answered: this one is closed at once
		c.Close()
		return
	}
	l.wg.Add(1)
	go func() { // owned by l: Close ends it and waits for it
		defer l.wg.Done()
		defer func() { <-l.answering }()
		stop := context.AfterFunc(l.ctx, func() { c.Close() })
		defer stop()
		// A client that is answered before it sent its request may take
		// the answer for a stray one (Go's transport does) and fail
		// otherwise: the answer waits for its first bytes.
		c.SetReadDeadline(time.Now().Add(ShedWait))
		var buf [512]byte
		c.Read(buf[:])
		c.SetWriteDeadline(time.Now().Add(ShedWriteTimeout))
		l.o.Shed(c)
		drain(c)
		c.Close()
	}()
}

// Share is a default cap for a listener: the process's open-file limit
// (RLIMIT_NOFILE) divided by div, at most ceiling (and ceiling when the limit is
// unknown), at least 1. The listeners of one process take shares that leave
// room for the rest of its descriptors (its own connections out, files).
func Share(div, ceiling int) int {
	lim := openFileLimit()
	if lim == 0 {
		return ceiling
	}
	return int(min(max(lim/uint64(div), 1), uint64(ceiling)))
}

// Answer is an HTTP/1.1 503 answer with Connection: close, for
// Options.Shed: header holds more header fields, each ending in CRLF; body
// is the text of the answer.
func Answer(header, body string) []byte {
	return fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"+
		"X-Content-Type-Options: nosniff\r\n%sRetry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		header, len(body), body)
}

// Open is the number of connections open.
func (l *Listener) Open() int { return int(l.open.Load()) }

// Close closes the listener, ends a backoff's wait and the answers to shed
// connections, and waits for them.
func (l *Listener) Close() error {
	l.cancel()
	err := l.Listener.Close()
	l.wg.Wait()
	return err
}

// Conn is a connection a Listener accepted: its first Close frees its place
// under the cap.
type Conn struct {
	net.Conn
	l      *Listener
	closed atomic.Bool
}

// Close closes the connection.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		c.l.open.Add(-1)
	}
	return err
}

// NetConn returns the connection underneath, as tls.Conn's does.
func (c *Conn) NetConn() net.Conn { return c.Conn }

// Temporary reports whether err, from Accept, is one to wait out.
func Temporary(err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return false
	}
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
		syscall.ECONNABORTED, syscall.ECONNRESET, syscall.EINTR, syscall.EAGAIN} {
		if errors.Is(err, e) {
			return true
		}
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// every lets a log line through at most once every logEvery, and counts the
// events in between.
type every struct {
	mu   sync.Mutex
	last time.Time
	n    int
}

// note counts an event and reports whether to log it, with the count of
// events since the last line (this one included).
func (e *every) note() (int, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	if !e.last.IsZero() && time.Since(e.last) < logEvery {
		return 0, false
	}
	n := e.n
	e.n, e.last = 0, time.Now()
	return n, true
}
