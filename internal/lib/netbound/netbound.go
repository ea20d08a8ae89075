// Package netbound bounds the writes to a network connection: each write
// must make progress within a timeout. A peer that takes nothing of a write
// for that long (hung, paused with SIGSTOP, or not reading an upload) fails
// it with a *TimeoutError, as nginx's proxy_send_timeout bounds the time
// between two writes. The gateway's connections to instances and from
// clients, and laneshttp's default transport, write through it.
//
// It is written here because net.Conn offers only absolute deadlines, which
// a writer would have to set before every write (each a runtime timer
// update): Writer keeps a deadline already set while it falls at most
// Slack(d) before the one asked (Keep), so that a busy connection sets one
// about once a second. A write is thus bounded by the timeout, and may fail
// up to Slack(d) sooner.
package netbound

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// Names are what a TimeoutError's message calls the parties of a write.
type Names struct {
	Peer    string // who did not take the write: "instance"
	What    string // what was written: "request"
	Setting string // the timeout's setting: "upstream write timeout"
}

// Writer writes to C, each write within the timeout D (0: none).
type Writer struct {
	C     net.Conn
	D     time.Duration
	Names *Names // for the message of a TimeoutError
	armed time.Time
}

// Write writes p to C within the timeout.
func (w *Writer) Write(p []byte) (int, error) {
	if w.D > 0 {
		if want := time.Now().Add(w.D); !Keep(w.armed, want, w.D) {
			w.C.SetWriteDeadline(want)
			w.armed = want
		}
	}
	n, err := w.C.Write(p)
	if err != nil && w.D > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
		err = &TimeoutError{D: w.D, Names: w.Names, Err: err}
	}
	return n, err
}

// Conn is a connection whose writes go through a Writer.
type Conn struct {
	net.Conn
	W Writer
}

// NetConn returns the connection that c wraps, as tls.Conn.NetConn does.
func (c *Conn) NetConn() net.Conn { return c.Conn }

// NewConn returns c with each write bounded by d, its timeout errors named
// by n.
func NewConn(c net.Conn, d time.Duration, n *Names) *Conn {
	return &Conn{Conn: c, W: Writer{C: c, D: d, Names: n}}
}

func (c *Conn) Write(p []byte) (int, error) { return c.W.Write(p) }

// CloseWrite closes the sending side (when the connection has one), as
// net/http's server does before it closes a connection whose request body
// it did not read.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// TimeoutError is a write that the peer did not take within the timeout.
type TimeoutError struct {
	D     time.Duration // the timeout
	Names *Names
	Err   error // the deadline's, os.ErrDeadlineExceeded
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("the %s took none of the %s for %s (the %s)", e.Names.Peer, e.Names.What, e.D, e.Names.Setting)
}
func (e *TimeoutError) Unwrap() error { return e.Err }
func (e *TimeoutError) Timeout() bool { return true }

// Keep reports whether a deadline armed (zero: none) may stay for one
// asked at want, of a timeout d: it falls at most Slack(d) before want.
func Keep(armed, want time.Time, d time.Duration) bool {
	return !armed.IsZero() && !armed.After(want) && want.Sub(armed) <= Slack(d)
}

// Slack is how much earlier than asked a kept deadline may fall: a tenth
// of d, at most a second.
func Slack(d time.Duration) time.Duration {
	return min(d/10, time.Second)
}
