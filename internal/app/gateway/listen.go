package gateway

import (
	"fmt"
	"net"

	"github.com/lanesdev/lanes/internal/lib/accept"
	"github.com/lanesdev/lanes/internal/lib/netbound"
)

// shedAnswer is the answer to a connection over the cap of max: written at
// once, before the request is read, and the connection closed.
func shedAnswer(max int) []byte {
	return accept.Answer(hError+": "+codeOverloaded+"\r\n",
		fmt.Sprintf("lanes: the gateway is at its limit of %d open connections (max_conns); try again\n", max))
}

// shed answers a connection over Config.MaxConns (accept.Options.Shed).
func (g *Gateway) shed(c net.Conn) { c.Write(g.shedAnswer) }

// maxHeaderBytes bounds a request head (the request line and the header
// fields, with their line ends) on either HTTP/1.1 stack. fasthttp's server
// bounds a head by its read buffer, which is this size, and answers 431 to
// a longer one. net/http's server counts a head from where its 4 KiB read
// buffer stands and lets it run MaxHeaderBytes and 4 KiB more (its "bufio
// slop"); with MaxHeaderBytes at stdMaxHeaderBytes it takes every head of
// up to maxHeaderBytes too, and answers 431 to those over it by more than
// what it had read ahead (the buffer's 4 KiB at most: on a new connection
// it reads ahead to look for the HTTP/2 preface).
const maxHeaderBytes = 16 << 10

// reset has the client's connection c end with a TCP reset when it closes
// (SO_LINGER 0) rather than with the orderly end that follows a whole
// answer: the end of an answer that was cut short (the instance failed
// mid-answer), which a client that reads the answer to the end of the
// connection (an HTTP/1.0 answer without a length) would
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

// clientWrites names the write timeout of a client's connection, on
// either stack (netbound): each write of an answer is bounded by the
// client write timeout, as nginx's send_timeout.
var clientWrites = &netbound.Names{Peer: "client", What: "answer", Setting: "client write timeout"}

// tcpConn is the TCP connection under the client's connection c, nil when
// it is not TCP underneath: every wrapper of a connection that the gateway
// serves unwraps with a NetConn method, as tls.Conn does.
func tcpConn(c net.Conn) *net.TCPConn {
	for {
		if tc, ok := c.(*net.TCPConn); ok {
			return tc
		}
		w, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		c = w.NetConn()
	}
}

// accepting wraps ln in the accept loop of the gateway's listeners (Serve,
// ServeTLS): accept errors waited out, connections capped.
func (g *Gateway) accepting(ln net.Listener) net.Listener {
	return accept.Wrap(ln, accept.Options{Name: "gateway", MaxConns: g.maxConns, Logger: g.log,
		Shed: g.shed, OnShed: func() { g.m.errors(codeOverloaded) }})
}
