// Command loopproxy is a floor for bench/gateway.sh, not a proxy for real
// traffic: the least an HTTP/1.1 proxy on an event loop does, in Go. It
// serves on github.com/panjf2000/gnet/v2 (one event loop per core, which
// reads a socket only once epoll has said it is readable, as nginx does),
// sends a request with `x-lane: alice` to the alice backend and any other to
// the baseline one, over one upstream connection per client connection and
// backend on the client's event loop, and copies the answer back. It knows
// no rules, rewrites no header, and serves only what bench/gateway.sh sends:
// a request without a body, answered with a Content-Length. Anything else
// closes the connection.
//
// With -parse it also does the header work of the gateway's fast path on
// each request, with the same library (fasthttp's header types): it parses
// the client's head and the instance's, writes the forwarding headers
// (X-Forwarded-For, -Host, -Proto; Forwarded removed), the lane headers
// (x-lane, baggage) and hop-by-hop removal on the way out, and x-lane and
// x-lane-served on the answer: what an event-loop path would add to the
// floor, short of the gateway's rules and pick.
//
//	loopproxy -baseline 127.0.0.1:9001 -alice 127.0.0.1:9002 [-parse]
//
// It prints the address it listens on, then serves until SIGINT or SIGTERM.
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"

	"github.com/panjf2000/gnet/v2"
	"github.com/panjf2000/gnet/v2/pkg/logging"
	"github.com/valyala/fasthttp"
)

var (
	headEnd       = []byte("\r\n\r\n")
	aliceHeader   = []byte("\r\nx-lane: alice\r\n") // as wrk and curl send it
	contentLength = []byte("\r\nContent-Length:")   // as net/http writes it
	requestBody   = [][]byte{[]byte("\r\ncontent-length:"), []byte("\r\nContent-Length:"), []byte("\r\ntransfer-encoding:"), []byte("\r\nTransfer-Encoding:")}
)

const (
	baseline = iota
	alice
)

type proxy struct {
	gnet.BuiltinEventEngine
	backends [2]net.Addr
	parse    bool
	booted   chan gnet.Engine
}

func (p *proxy) OnBoot(eng gnet.Engine) gnet.Action {
	p.booted <- eng
	return gnet.None
}

// client is a client connection's state: its upstream connections, and the
// request waiting for one to open.
type client struct {
	up      [2]gnet.Conn
	pending []byte
	parse   bool // with -parse
}

// headsPool holds the header work of -parse: an event loop runs one
// connection's event at a time, so that a loop needs one heads, and the
// pool keeps one per loop (per P) warm in its cache, as an event-loop
// server keeps its parser per loop rather than per connection.
var headsPool = sync.Pool{New: func() any { return &heads{r: bufio.NewReaderSize(nil, 4096)} }}

// heads is the header work of -parse: fasthttp's
// parsers read from r, over the bytes of one head.
type heads struct {
	req  fasthttp.RequestHeader
	resp fasthttp.ResponseHeader
	src  bytes.Reader
	r    *bufio.Reader
	out  []byte
}

var (
	laneName     = []byte("alice")
	baggageAlice = []byte("lane=alice")
	servedValue  = [2][]byte{[]byte("baseline"), []byte("alice")}
	peerAddr     = []byte("127.0.0.1")
	protoHTTP    = []byte("http")
)

// request parses head, rewrites it as the gateway does, and returns the
// backend and the head to send.
func (h *heads) request(head []byte) (int, []byte, bool) {
	h.src.Reset(head)
	h.r.Reset(&h.src)
	if err := h.req.Read(h.r); err != nil {
		return 0, nil, false
	}
	if n := h.req.ContentLength(); n > 0 || n == -1 { // a body, or a chunked one
		return 0, nil, false
	}
	b := baseline
	if bytes.Equal(h.req.Peek("X-Lane"), laneName) {
		b = alice
	}
	h.req.Del("Connection")
	h.req.Del("Forwarded")
	h.req.SetBytesV("X-Forwarded-For", peerAddr)
	h.req.SetBytesV("X-Forwarded-Host", h.req.Host())
	h.req.SetBytesV("X-Forwarded-Proto", protoHTTP)
	h.req.Del("X-Lane")
	h.req.Del("Baggage")
	if b == alice {
		h.req.SetBytesV("X-Lane", laneName)
		h.req.SetBytesV("Baggage", baggageAlice)
	}
	h.out = h.req.AppendBytes(h.out[:0])
	return b, h.out, true
}

// answer parses an answer's head, whose body is n bytes long, and rewrites
// it as the gateway does.
func (h *heads) answer(head []byte, b, n int) ([]byte, bool) {
	h.src.Reset(head)
	h.r.Reset(&h.src)
	if err := h.resp.Read(h.r); err != nil || h.resp.ContentLength() != n {
		return nil, false
	}
	h.resp.Del("X-Lane-Served")
	h.resp.Del("X-Lane")
	if b == alice {
		h.resp.SetBytesV("X-Lane", laneName)
	}
	h.resp.SetBytesV("X-Lane-Served", servedValue[b])
	h.out = h.resp.AppendBytes(h.out[:0])
	return h.out, true
}

// upstream is an upstream connection's state.
type upstream struct {
	client  gnet.Conn
	backend int
}

func (p *proxy) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	u, ok := c.Context().(*upstream)
	if !ok {
		cl := &client{}
		if p.parse {
			cl.parse = true
		}
		c.SetContext(cl)
		return nil, gnet.None
	}
	cl, ok := u.client.Context().(*client)
	if !ok { // the client left while this connection opened
		return nil, gnet.Close
	}
	cl.up[u.backend] = c
	if cl.pending != nil {
		_, _ = c.Write(cl.pending)
		cl.pending = nil
	}
	return nil, gnet.None
}

func (p *proxy) OnClose(c gnet.Conn, _ error) gnet.Action {
	switch s := c.Context().(type) {
	case *upstream:
		if cl, ok := s.client.Context().(*client); ok && cl.up[s.backend] == c {
			// An answer may have been cut: the client's connection goes too.
			_ = s.client.Close()
		}
	case *client:
		c.SetContext(nil)
		for _, u := range s.up {
			if u != nil {
				_ = u.Close()
			}
		}
	}
	return gnet.None
}

func (p *proxy) OnTraffic(c gnet.Conn) gnet.Action {
	switch s := c.Context().(type) {
	case *upstream:
		return s.answer(c)
	case *client:
		return p.request(c, s)
	}
	return gnet.Close
}

// request sends the client's request, once its head is in, upstream.
func (p *proxy) request(c gnet.Conn, cl *client) gnet.Action {
	buf, _ := c.Peek(-1)
	end := bytes.Index(buf, headEnd)
	if end < 0 {
		return gnet.None
	}
	head := buf[:end+4]
	n := len(head)
	b := baseline
	if cl.parse {
		h := headsPool.Get().(*heads)
		defer headsPool.Put(h) // after the write, which copies what it does not send
		var ok bool
		if b, head, ok = h.request(head); !ok {
			return gnet.Close
		}
	} else {
		for _, h := range requestBody {
			if bytes.Contains(head, h) {
				return gnet.Close
			}
		}
		if bytes.Contains(head, aliceHeader) {
			b = alice
		}
	}
	if up := cl.up[b]; up != nil {
		_, _ = up.Write(head)
	} else {
		cl.pending = append(cl.pending[:0], head...)
		ctx := gnet.NewContext(context.Background(), &upstream{client: c, backend: b})
		if _, err := c.EventLoop().Register(ctx, p.backends[b]); err != nil {
			return gnet.Close
		}
	}
	_, _ = c.Discard(n)
	return gnet.None
}

// answer copies an answer, once it is whole, to the client.
func (u *upstream) answer(c gnet.Conn) gnet.Action {
	buf, _ := c.Peek(-1)
	end := bytes.Index(buf, headEnd)
	if end < 0 {
		return gnet.None
	}
	i := bytes.Index(buf[:end+2], contentLength)
	if i < 0 {
		return gnet.Close
	}
	v := buf[i+len(contentLength) : end+2]
	v = v[:bytes.IndexByte(v, '\r')]
	n, err := strconv.Atoi(string(bytes.TrimSpace(v)))
	if err != nil || n < 0 {
		return gnet.Close
	}
	whole := end + 4 + n
	if len(buf) < whole {
		return gnet.None
	}
	if cl, ok := u.client.Context().(*client); ok && cl.parse {
		h := headsPool.Get().(*heads)
		defer headsPool.Put(h)
		head, ok := h.answer(buf[:end+4], u.backend, n)
		if !ok {
			return gnet.Close
		}
		_, _ = u.client.Writev([][]byte{head, buf[end+4 : whole]})
	} else {
		_, _ = u.client.Write(buf[:whole])
	}
	_, _ = c.Discard(whole)
	return gnet.None
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	base := flag.String("baseline", "", "address of the baseline backend")
	al := flag.String("alice", "", "address of the alice backend")
	parse := flag.Bool("parse", false, "parse and rewrite both heads with fasthttp's header types, as the gateway does")
	flag.Parse()
	p := &proxy{booted: make(chan gnet.Engine, 1), parse: *parse}
	for i, f := range []struct{ name, addr string }{{"baseline", *base}, {"alice", *al}} {
		if f.addr == "" {
			log.Fatalf("loopproxy: -%s is required (the %s backend's host:port)", f.name, f.name)
		}
		ta, err := net.ResolveTCPAddr("tcp", f.addr)
		if err != nil {
			log.Fatalf("loopproxy: -%s %q: %v", f.name, f.addr, err)
		}
		p.backends[i] = ta
	}
	// gnet takes an address, not a listener: find a free port, then listen on it.
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	listen := l.Addr().String()
	_ = l.Close()
	fmt.Println(listen)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() {
		errc <- gnet.Run(p, "tcp://"+listen, gnet.WithMulticore(true),
			gnet.WithTCPNoDelay(gnet.TCPNoDelay), gnet.WithLogLevel(logging.ErrorLevel))
	}()
	select {
	case err := <-errc:
		log.Fatal(err)
	case eng := <-p.booted:
		select {
		case err := <-errc:
			log.Fatal(err)
		case <-ctx.Done():
			_ = eng.Stop(context.Background())
			<-errc
		}
	}
}
