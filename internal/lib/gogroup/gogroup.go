// Package gogroup runs the goroutines of an owner (a registry backend, a
// store) so that the owner's Close can cancel them and wait for them.
package gogroup

import (
	"context"
	"sync"
)

// Group is a set of goroutines that share one context, cancelled by Close.
// The zero value is not usable; call New.
type Group struct {
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// New returns an open Group.
func New() *Group {
	g := &Group{}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	return g
}

// Context is cancelled by Close: the parent of everything the goroutines do.
func (g *Group) Context() context.Context { return g.ctx }

// Go runs f in a goroutine that Close waits for. It returns false, and does
// not run f, once the Group is closed.
func (g *Group) Go(f func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		f()
	}()
	return true
}

// Closed reports whether Close has been called.
func (g *Group) Closed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// Close cancels the context and waits for every goroutine. It returns false
// when the Group was closed already (and then does not wait).
func (g *Group) Close() bool {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return false
	}
	g.closed = true
	g.mu.Unlock()
	g.cancel()
	g.wg.Wait()
	return true
}
