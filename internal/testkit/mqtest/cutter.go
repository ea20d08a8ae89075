package mqtest

import (
	"context"
	"net"
	"sync"
	"time"
)

// A Cutter dials a client's connections and can cut them all at once, as a
// crash cuts them; it refuses to dial after that. Backends' Kill use it.
type Cutter struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

// DialContext dials addr, unless the connections were cut.
func (c *Cutter) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut {
		return nil, net.ErrClosed
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	conn, err := d.DialContext(ctx, network, addr)
	if err == nil {
		c.conns = append(c.conns, conn)
	}
	return conn, err
}

// Dial is DialContext without a context.
func (c *Cutter) Dial(network, addr string) (net.Conn, error) {
	return c.DialContext(context.Background(), network, addr)
}

// Cut closes every connection dialled and refuses new ones.
func (c *Cutter) Cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut = true
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = nil
}
