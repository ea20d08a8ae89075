// Package faultln makes a listener fail: Accept returns an error a given
// number of times, then accepts as the listener underneath does. It stands
// for a process out of file descriptors (EMFILE) where making one run out
// for real would take every other test's descriptors with it.
//
// As a process out of descriptors, it fails only once a connection waits:
// Accept takes the next connection, and while failures are left returns the
// error and keeps the connection for a later Accept, which is how a test
// knows that the errors it asked for came before that connection.
package faultln

import (
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
)

// Listener is a listener whose next Accepts fail.
type Listener struct {
	net.Listener
	fails atomic.Int64
	// Errs counts the errors returned.
	Errs atomic.Int64
	err  error
	mu   sync.Mutex
	held net.Conn // accepted, not yet returned
}

// New returns ln whose next n Accepts that have a connection fail with
// errno, as the net package returns it (a *net.OpError around an
// *os.SyscallError).
func New(ln net.Listener, n int, errno syscall.Errno) *Listener {
	l := &Listener{Listener: ln, err: &net.OpError{Op: "accept", Net: "tcp", Addr: ln.Addr(),
		Err: os.NewSyscallError("accept4", errno)}}
	l.fails.Store(int64(n))
	return l
}

// Fail has the next n Accepts that have a connection fail.
func (l *Listener) Fail(n int) { l.fails.Store(int64(n)) }

// Accept takes a connection; while failures are left it keeps it and
// fails, else it returns it.
func (l *Listener) Accept() (net.Conn, error) {
	l.mu.Lock()
	c := l.held
	l.held = nil
	l.mu.Unlock()
	if c == nil {
		var err error
		if c, err = l.Listener.Accept(); err != nil {
			return nil, err
		}
	}
	if l.fails.Add(-1) >= 0 {
		l.mu.Lock()
		l.held = c
		l.mu.Unlock()
		l.Errs.Add(1)
		return nil, l.err
	}
	return c, nil
}

// Close closes the listener and a connection it keeps.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.held != nil {
		l.held.Close()
		l.held = nil
	}
	l.mu.Unlock()
	return l.Listener.Close()
}
