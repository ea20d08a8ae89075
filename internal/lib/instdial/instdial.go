// Package instdial is the connection of a transport to an instance, written
// once for laneshttp and lanesgrpc: the address rules (addrpolicy's zero
// rules: no link-local or cloud metadata address), and, when LANES_DIAL
// names a proxy, the connection made through it.
//
// LANES_DIAL is set by `lanes dev --tunnel` for the processes of a
// developer's machine (docs/dev.md): http://127.0.0.1:PORT, its local proxy,
// which opens each connection with an HTTP CONNECT through the tunnel to
// `lanes up`, whose control plane dials the instance. The routing stays the
// process's own: it picks the instance, and only the connection travels.
package instdial

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/lanesdev/lanes/internal/lib/addrpolicy"
)

// Env is the variable that names the proxy to dial instances through.
const Env = "LANES_DIAL"

// Func dials an instance.
type Func func(ctx context.Context, network, addr string) (net.Conn, error)

// Dialer returns the dial function of d (a zero net.Dialer when nil) with
// the address rules, which dials through the proxy of LANES_DIAL when it is
// set (read at each dial, as the process's environment says then). A
// connection that the proxy could not make fails as a dial does (a
// *net.OpError, Op "dial"), so that the routed call counts the instance
// unreachable and moves on.
func Dialer(d *net.Dialer) Func {
	var rules *addrpolicy.Rules
	direct := rules.Dialer(d)
	plain := net.Dialer{}
	if d != nil {
		plain = *d
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		proxy := os.Getenv(Env)
		if proxy == "" {
			return direct.DialContext(ctx, network, addr)
		}
		if ap, err := netip.ParseAddrPort(addr); err == nil {
			if err := rules.CheckIP(addr, ap); err != nil {
				return nil, &net.OpError{Op: "dial", Net: network, Err: err}
			}
		}
		c, err := Connect(ctx, &plain, proxy, addr)
		if err != nil {
			return nil, &net.OpError{Op: "dial", Net: network, Err: err}
		}
		return c, nil
	}
}

// Connect opens a connection to addr through the HTTP proxy at proxy (a URL
// such as http://127.0.0.1:4040, or host:port) with a CONNECT request.
func Connect(ctx context.Context, d *net.Dialer, proxy, addr string) (net.Conn, error) {
	host := proxy
	if strings.Contains(proxy, "://") {
		u, err := url.Parse(proxy)
		if err != nil || u.Scheme != "http" || u.Host == "" {
			return nil, fmt.Errorf("%s %q: want http://host:port", Env, proxy)
		}
		host = u.Host
	}
	c, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, fmt.Errorf("%s proxy %s: %w", Env, host, err)
	}
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(30 * time.Second)
	}
	c.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", addr, addr); err != nil {
		c.Close()
		return nil, fmt.Errorf("%s proxy %s: %w", Env, host, err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("%s proxy %s: %w", Env, host, err)
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		c.Close()
		return nil, fmt.Errorf("%s proxy %s: %s: %s", Env, host, resp.Status, strings.TrimSpace(string(msg)))
	}
	if !stop() {
		c.Close()
		return nil, ctx.Err()
	}
	c.SetDeadline(time.Time{})
	if br.Buffered() > 0 {
		return &bufConn{Conn: c, br: br}, nil
	}
	return c, nil
}

// bufConn reads what the proxy's answer left in its reader first.
type bufConn struct {
	net.Conn
	br *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.br.Read(p) }
