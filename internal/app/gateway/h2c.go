package gateway

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// errHTTP1Only is the error of a gRPC call whose instance answered the
// gateway's HTTP/2 connection (h2c, prior knowledge) with HTTP/1: the
// instance speaks HTTP/1 only, and cannot serve gRPC. It says nothing about
// the instance's health: outlier detection ignores it.
var errHTTP1Only = errors.New("the instance speaks HTTP/1 only: it answered the gateway's HTTP/2 connection (h2c, for gRPC) with HTTP/1")

// http1Prefix opens every HTTP/1 answer; no HTTP/2 connection opens with
// it (as a frame header its length, 0x485454, is over any frame size).
const http1Prefix = "HTTP/1."

// checkWait bounds how long a failed write on an h2cConn waits for the
// check of the connection's first bytes, which the transport's read loop
// makes as soon as the bytes are there (or the connection ends).
const checkWait = 5 * time.Second

// h2cConn is a connection of the gateway's h2c transport: it checks the
// first bytes that the instance sends, and fails the read that would hand
// an HTTP/1 answer to the HTTP/2 framer with errHTTP1Only (which would
// read it as a frame too large), so that the call fails with an error that
// says what happened, and marks the connection (http1), which the attempt
// that had it reads (stdSend.http1Only). A write that fails because the
// instance closed the connection (as it does after its HTTP/1 answer)
// waits for the check, which the answer's bytes or the connection's end
// make at once, and fails with errHTTP1Only when the instance spoke
// HTTP/1. The
// transport reads a connection on one goroutine.
type h2cConn struct {
	net.Conn
	seen    int // bytes of the answer checked, up to len(http1Prefix)
	http1   atomic.Bool
	checked chan struct{} // closed once the first bytes are checked, or the reads ended before
	once    sync.Once
}

func (c *h2cConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.seen < len(http1Prefix) {
		if n > 0 {
			m := min(n, len(http1Prefix)-c.seen)
			if string(p[:m]) != http1Prefix[c.seen:c.seen+m] {
				c.seen = len(http1Prefix) // not HTTP/1
			} else if c.seen += m; c.seen == len(http1Prefix) {
				c.http1.Store(true)
				c.check()
				return 0, errHTTP1Only
			}
		}
		if c.seen == len(http1Prefix) || err != nil {
			c.check()
		}
	}
	return n, err
}

func (c *h2cConn) check() { c.once.Do(func() { close(c.checked) }) }

func (c *h2cConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil && (errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) {
		t := time.NewTimer(checkWait)
		select {
		case <-c.checked:
		case <-t.C:
		}
		t.Stop()
		if c.http1.Load() {
			err = errHTTP1Only
		}
	}
	return n, err
}

// dialH2C wraps the connections of dial in h2cConns.
func dialH2C(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &h2cConn{Conn: c, checked: make(chan struct{})}, nil
	}
}
