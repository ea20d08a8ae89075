package etcdtest

import (
	"io"
	"net"
	"sync"
)

// proxy forwards TCP connections from a listener to a target address. The
// embedded server sits behind one so that Stop can cut every client
// connection at once, as a dying process would: etcd's own graceful close
// waits up to its request timeout (7s) for open watch streams to end.
type proxy struct {
	l      net.Listener
	target string

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup // serve and the connection goroutines
}

func newProxy(addr, target string) (*proxy, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &proxy{l: l, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *proxy) addr() string { return p.l.Addr().String() }

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.pipe(c)
	}
}

// track records c so that close can cut it; it reports false (and closes c)
// when the proxy is already closed.
func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *proxy) pipe(c net.Conn) {
	defer p.wg.Done()
	if !p.track(c) {
		return
	}
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(u) {
		c.Close()
		return
	}
	done := make(chan struct{}, 2)
	go func() { io.Copy(u, c); done <- struct{}{} }()
	go func() { io.Copy(c, u); done <- struct{}{} }()
	<-done
	c.Close()
	u.Close()
	<-done
}

// close stops accepting, cuts every connection and waits for the proxy's
// goroutines.
func (p *proxy) close() {
	p.l.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
