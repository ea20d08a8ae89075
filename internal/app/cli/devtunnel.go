package cli

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/internal/app/sidecar"
	"github.com/lanesdev/lanes/internal/lib/backoff"
	"github.com/lanesdev/lanes/internal/lib/instdial"
	"github.com/lanesdev/lanes/internal/lib/tlsfiles"
	"github.com/lanesdev/lanes/internal/lib/tunnel"
	"github.com/lanesdev/lanes/lanesenv"
	"github.com/lanesdev/lanes/registry"
)

// devTunnel is `lanes dev` through a tunnel (docs/dev.md): the instance is
// registered by the control plane at a relay of its own, which sends each
// connection through the tunnel to the local process; the machine's own
// calls reach the environment through it.
type devTunnel struct {
	c         *apiClient
	caFile    string
	inst      registry.Instance
	labels    map[string]string // the user's, sent with the tunnel
	out, errw io.Writer
	claimIP   bool
	info      adminapi.Info
	command   []string // run with the variables once the tunnel is up

	cur  atomic.Pointer[tunnel.Client]
	upMu sync.Mutex
	up   chan struct{} // closed while a tunnel is in force
	quit chan struct{} // closed when dev ends
	mu   sync.Mutex    // serialises the lines written to out
	wg   sync.WaitGroup
	lns  []net.Listener
	// The outbound proxy for processes without the SDK.
	env    *lanesenv.Env
	outLn  *connListener
	outSrv *http.Server
	seen   atomic.Int64 // requests printed
}

// awaitTunnel bounds how long a connection of the dial proxy or the NATS
// forward waits for a tunnel that is reconnecting.
const awaitTunnel = 10 * time.Second

// setTunnel makes tc (nil while reconnecting) the tunnel in force.
func (d *devTunnel) setTunnel(tc *tunnel.Client) {
	d.upMu.Lock()
	defer d.upMu.Unlock()
	d.setTunnelLocked(tc)
}

func (d *devTunnel) setTunnelLocked(tc *tunnel.Client) {
	d.cur.Store(tc)
	if d.up == nil {
		d.up = make(chan struct{})
	}
	select {
	case <-d.up:
		if tc == nil {
			d.up = make(chan struct{})
		}
	default:
		if tc != nil {
			close(d.up)
		}
	}
}

// dropTunnel marks tc, if it is still in force, as dropped.
func (d *devTunnel) dropTunnel(tc *tunnel.Client) {
	d.upMu.Lock()
	defer d.upMu.Unlock()
	if d.cur.Load() == tc {
		d.setTunnelLocked(nil)
	}
}

func (d *devTunnel) upChan() chan struct{} {
	d.upMu.Lock()
	defer d.upMu.Unlock()
	return d.up
}

// reconnect is the backoff of the tunnel's reconnection.
var reconnect = struct{ min, max time.Duration }{100 * time.Millisecond, 2 * time.Second}

func (d *devTunnel) printf(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fmt.Fprintf(d.out, format, args...)
}

func (d *devTunnel) query() string {
	q := url.Values{}
	q.Set("service", d.inst.Service)
	q.Set("id", d.inst.ID)
	q.Set("lane", d.inst.Lane)
	if d.inst.Zone != "" {
		q.Set("zone", d.inst.Zone)
	}
	q.Set("host", d.inst.Host)
	q.Set("version", d.inst.Version)
	for k, v := range d.labels {
		if k != registry.LabelPath {
			q.Add("label", k+"="+v)
		}
	}
	return q.Encode()
}

func (d *devTunnel) httpClient() (*http.Client, error) {
	var tc *tls.Config
	if d.caFile != "" {
		var err error
		if tc, err = tlsfiles.Client(d.caFile); err != nil {
			return nil, err
		}
	}
	return tunnel.HTTPClient(tc), nil
}

// dial opens the tunnel once.
func (d *devTunnel) dial(ctx context.Context, hc *http.Client) (*tunnel.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tc, err := tunnel.Dial(ctx, d.c.URL(), d.c.token, d.query(), hc)
	var he *tunnel.HandshakeError
	if errors.As(err, &he) && he.Status != 0 {
		var body adminapi.ErrorBody
		if json.Unmarshal(he.Body, &body) == nil && body.Error != nil {
			body.Error.Status = he.Status
			return nil, apiFailure(d.c, body.Error)
		}
	}
	return tc, err
}

// run keeps the tunnel up until ctx ends: it reconnects with backoff when
// the tunnel drops, and says so; at the end it tells the control plane,
// which deregisters the instance at once.
func (d *devTunnel) run(ctx context.Context) error {
	hc, err := d.httpClient()
	if err != nil {
		return &exitError{code: ExitUsage, err: fmt.Errorf("--ca-file: %v", err)}
	}
	defer hc.CloseIdleConnections()
	tc, err := d.dial(ctx, hc)
	if err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			return err
		}
		return &exitError{code: ExitFail, err: fmt.Errorf("open the tunnel to %s: %v", d.c.URL(), err)}
	}
	d.quit = make(chan struct{})
	d.setTunnel(tc)
	defer d.closeListeners()
	h := tc.Hello
	rtt, _ := tc.RTT()
	d.printf("lanes dev: %s/%s registered in lane %s at %s, through a tunnel to %s (registration %s; this machine is %s to it; round trip %s)\n",
		h.Service, h.ID, h.Lane, h.Addr, d.c.URL(), h.Registration, h.From, rtt.Round(time.Microsecond))
	d.printf("lanes dev: connections to %s are relayed to %s here\n", h.Addr, d.inst.Addr)
	env, err := d.listen(h.NATS)
	if err != nil {
		tc.Close(3 * time.Second)
		return &exitError{code: ExitFail, err: err}
	}
	d.printf("For this machine's processes (lanesenv reads these; the SDK's calls dial through the tunnel, routed by lanes):\n")
	for _, kv := range env {
		d.printf("  export %s\n", kv)
	}
	d.printf("  export %s=<your lane token>\n", adminclient.EnvToken)
	d.printf("Processes without the SDK call the environment's services through the same address as an HTTP proxy, routed by lanes in the lane each call carries:\n")
	d.printf("  curl -x %s -H 'x-lane: %s' http://SERVICE/...\n", strings.TrimPrefix(env[1], instdial.Env+"="), h.Lane)
	if d.claimIP {
		d.claim(ctx, h.Registration)
	}
	d.mu.Lock()
	printCurls(d.out, d.info, h.Service, h.Lane, d.claimIP)
	d.mu.Unlock()
	d.printf("Ctrl-C deregisters.\n")

	var child <-chan error
	if len(d.command) > 0 {
		ch, err := d.start(ctx, env)
		if err != nil {
			tc.Close(3 * time.Second)
			return &exitError{code: ExitFail, err: err}
		}
		child = ch
	}
	var childErr error
	b := backoff.New(reconnect.min, reconnect.max)
	for {
		d.wg.Add(1)
		go d.serve(tc)
		select {
		case <-ctx.Done():
		case childErr = <-child:
			child = nil
		case <-tc.Done():
			d.setTunnel(nil)
			d.printf("lanes dev: the tunnel to %s dropped; the control plane deregistered %s/%s; reconnecting\n", d.c.URL(), h.Service, h.ID)
			for {
				if !b.Wait(ctx) {
					break
				}
				next, err := d.dial(ctx, hc)
				if err != nil {
					if ctx.Err() == nil {
						d.printf("lanes dev: reconnect failed: %v; trying again\n", err)
					}
					continue
				}
				b.Reset()
				tc = next
				d.setTunnel(tc)
				d.printf("lanes dev: the tunnel is back: %s/%s registered again in lane %s at %s (registration %s)\n",
					tc.Hello.Service, tc.Hello.ID, tc.Hello.Lane, tc.Hello.Addr, tc.Hello.Registration)
				if d.claimIP {
					d.claim(ctx, tc.Hello.Registration)
				}
				break
			}
			if ctx.Err() == nil {
				continue
			}
		}
		break
	}
	d.setTunnel(nil)
	close(d.quit)
	ok := tc.Close(3 * time.Second)
	d.closeListeners()
	d.wg.Wait()
	if ok {
		d.printf("lanes dev: %s/%s deregistered\n", h.Service, h.ID)
	} else {
		fmt.Fprintf(d.errw, "lanes dev: the control plane did not confirm the deregistration; the instance is gone when the tunnel's end reaches it\n")
	}
	if childErr != nil {
		var ee *exec.ExitError
		if errors.As(childErr, &ee) {
			return &exitError{code: ee.ExitCode()}
		}
		return &exitError{code: ExitFail, err: childErr}
	}
	return nil
}

func (d *devTunnel) claim(ctx context.Context, reg string) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	cl, err := d.c.Claim(cctx, adminapi.ClaimRequest{Lane: d.inst.Lane, Registration: reg})
	if err != nil {
		fmt.Fprintf(d.errw, "lanes dev: could not claim this client for lane %s: %v\n", d.inst.Lane, err)
		return
	}
	d.printf("lanes dev: client %s claimed for lane %s: its requests through the gateway go to lane %s\n", cl.IP, d.inst.Lane, d.inst.Lane)
}

// start runs the command with the variables, its output on dev's.
func (d *devTunnel) start(ctx context.Context, env []string) (<-chan error, error) {
	cmd := exec.CommandContext(ctx, d.command[0], d.command[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, d.out, d.errw
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("run %s: %v", d.command[0], err)
	}
	ch := make(chan error, 1)
	go func() { ch <- cmd.Wait() }()
	return ch, nil
}

// listen opens the machine's loopback listeners: the dial proxy (LANES_DIAL)
// and the NATS forward (LANES_NATS). It returns the variables to export.
func (d *devTunnel) listen(nats bool) ([]string, error) {
	env := []string{"LANES_REGISTRY=" + d.c.URL()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("the local dial proxy: %v", err)
	}
	d.lns = append(d.lns, ln)
	proxy := "http://" + ln.Addr().String()
	// This process's own routed calls (the outbound proxy's) dial through
	// the tunnel too.
	os.Setenv(instdial.Env, proxy)
	if err := d.routing(ln.Addr()); err != nil {
		return nil, err
	}
	d.accept(ln, "proxy", d.proxy)
	env = append(env, instdial.Env+"="+proxy)
	if nats {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("the local NATS forward: %v", err)
		}
		d.lns = append(d.lns, ln)
		d.accept(ln, "NATS forward", d.nats)
		env = append(env, "LANES_NATS=nats://"+ln.Addr().String())
	}
	return env, nil
}

func (d *devTunnel) closeListeners() {
	for _, ln := range d.lns {
		ln.Close()
	}
	d.lns = nil
	if d.outSrv != nil {
		d.outSrv.Close()
		d.outSrv = nil
	}
	if d.env != nil {
		d.env.Close()
		d.env = nil
	}
}

// routing starts the outbound proxy for processes without the SDK:
// lanes sidecar's (internal/app/sidecar), on an engine that follows the
// registry and the policy through the admin API with dev's token, whose
// calls dial through the tunnel. It is served on the dial proxy's address:
// a CONNECT goes through the tunnel as it is, any other request is routed.
func (d *devTunnel) routing(own net.Addr) error {
	vars := map[string]string{"LANES_REGISTRY": d.c.URL(), adminclient.EnvToken: d.c.token, adminclient.EnvCAFile: d.caFile}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	env, err := lanesenv.Open(ctx, lanesenv.WithGetenv(func(k string) string { return vars[k] }),
		lanesenv.WithLogger(slog.New(slog.NewTextHandler(d.errw, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		return fmt.Errorf("the routing of the local proxy: %v", err)
	}
	d.env = env
	d.outLn = &connListener{ch: make(chan net.Conn), done: make(chan struct{}), addr: own}
	d.outSrv = &http.Server{Handler: sidecar.Outbound(env.Engine, own, env.Logger), ReadHeaderTimeout: 10 * time.Second}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.outSrv.Serve(d.outLn)
	}()
	return nil
}

// proxy serves one connection of the local proxy: a CONNECT through the
// tunnel (LANES_DIAL), any other request to the outbound proxy.
func (d *devTunnel) proxy(c net.Conn) {
	br := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	head, err := br.Peek(len("CONNECT "))
	c.SetReadDeadline(time.Time{})
	if err != nil {
		c.Close()
		return
	}
	bc := tunnel.Buffered(c, br)
	if string(head) == "CONNECT " {
		tunnel.ServeConnect(bc, awaitTunnel+10*time.Second, func(addr string) (net.Conn, error) { return d.open("dial " + addr) })
		return
	}
	select {
	case d.outLn.ch <- bc:
	case <-d.outLn.done:
		c.Close()
	}
}

// connListener hands the outbound proxy's connections to its server.
type connListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
	addr net.Addr
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.addr }

// accept serves ln (loopback only, by choice: the machine's own processes)
// with handle, a goroutine per connection, capped.
func (d *devTunnel) accept(ln net.Listener, name string, handle func(net.Conn)) {
	tunnel.ServeEach(ln, "lanes dev "+name, tunnel.MaxStreams, nil, &d.wg, handle)
}

// open opens a stream of the tunnel in force, waiting up to awaitTunnel
// for one while dev reconnects (a stream that fails because its tunnel has
// just dropped is opened again on the next).
func (d *devTunnel) open(request string) (net.Conn, error) {
	t := time.NewTimer(awaitTunnel)
	defer t.Stop()
	for attempt := 0; ; attempt++ {
		tc := d.cur.Load()
		if tc == nil {
			select {
			case <-d.upChan():
			case <-t.C:
			case <-d.quit:
			}
			if tc = d.cur.Load(); tc == nil {
				return nil, errors.New("the tunnel is down; lanes dev is reconnecting")
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), tunnel.OpenTimeout+tunnel.WriteTimeout)
		c, err := tc.Open(ctx, request)
		cancel()
		if err == nil || attempt > 0 {
			return c, err
		}
		select {
		case <-tc.Done(): // dropped: try the next tunnel
			d.dropTunnel(tc)
		default:
			return nil, err
		}
	}
}

// nats forwards one connection to the environment's NATS server.
func (d *devTunnel) nats(c net.Conn) {
	st, err := d.open("nats")
	if err != nil {
		c.Close()
		return
	}
	tunnel.Pipe(c, st)
}

// serve relays the connections that come through tc to the local process,
// until tc ends.
func (d *devTunnel) serve(tc *tunnel.Client) {
	defer d.wg.Done()
	for {
		st, err := tc.Accept()
		if err != nil {
			return
		}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			local, err := net.DialTimeout("tcp", d.inst.Addr, 3*time.Second)
			if err != nil {
				d.printf("lanes dev: a connection for lane %s could not reach %s: %v\n", d.inst.Lane, d.inst.Addr, err)
				st.Close()
				return
			}
			t := newTap(d.printRequest)
			tunnel.Pipe(&tapConn{Conn: st, tap: t}, local)
			t.close()
		}()
	}
}

func (d *devTunnel) printRequest(proto, method, path, l, trace string) {
	d.seen.Add(1)
	if l == "" {
		l = "(none)"
	}
	if trace == "" {
		trace = "(none)"
	}
	d.printf("lanes dev: ← %s %s %s lane=%s trace=%s\n", proto, method, path, l, trace)
}

// A tap reads a copy of what a relayed connection brings to the local
// process, in a goroutine of its own, and prints each request it finds
// there (HTTP/1.1, or the HEADERS of HTTP/2 and gRPC). It never holds the
// connection back: when it falls behind by tapDepth chunks, it stops
// reading that connection.
type tap struct {
	ch   chan []byte
	full bool
	done chan struct{}
}

const tapDepth = 64

func newTap(print func(proto, method, path, lane, trace string)) *tap {
	t := &tap{ch: make(chan []byte, tapDepth), done: make(chan struct{})}
	go func() {
		defer close(t.done)
		r := &chanReader{ch: t.ch}
		parseRequests(bufio.NewReaderSize(r, 16<<10), print)
		for range t.ch { // drain after a parse error
		}
	}()
	return t
}

func (t *tap) feed(p []byte) {
	if t.full {
		return
	}
	select {
	case t.ch <- append([]byte(nil), p...):
	default:
		t.full = true
	}
}

func (t *tap) close() {
	close(t.ch)
	<-t.done
}

type chanReader struct {
	ch  chan []byte
	cur []byte
}

func (r *chanReader) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		b, ok := <-r.ch
		if !ok {
			return 0, io.EOF
		}
		r.cur = b
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// tapConn is a relayed connection whose reads are copied to a tap.
type tapConn struct {
	net.Conn
	tap *tap
}

// Unwrap returns the tunnel's stream, for tunnel.Pipe to find its tunnel.
func (c *tapConn) Unwrap() net.Conn { return c.Conn }

func (c *tapConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.tap.feed(p[:n])
	}
	return n, err
}

// parseRequests reads requests from br until it ends or cannot parse.
func parseRequests(br *bufio.Reader, print func(proto, method, path, lane, trace string)) {
	if b, err := br.Peek(len(http2.ClientPreface)); err == nil && string(b) == http2.ClientPreface {
		br.Discard(len(b))
		fr := http2.NewFramer(nil, br)
		fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		fr.MaxHeaderListSize = 64 << 10
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			mh, ok := f.(*http2.MetaHeadersFrame)
			if !ok {
				continue
			}
			proto := "HTTP/2"
			if strings.HasPrefix(first(mh, "content-type"), "application/grpc") {
				proto = "gRPC"
			}
			print(proto, mh.PseudoValue("method"), mh.PseudoValue("path"), first(mh, "x-lane"), traceID(first(mh, "traceparent")))
		}
	}
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		print("HTTP/1.1", req.Method, req.URL.RequestURI(), req.Header.Get("X-Lane"), traceID(req.Header.Get("Traceparent")))
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return
		}
		if req.Header.Get("Upgrade") != "" {
			return // what follows is not HTTP/1.1
		}
	}
}

func first(mh *http2.MetaHeadersFrame, name string) string {
	for _, f := range mh.RegularFields() {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}

// traceID is the trace id of a W3C traceparent header.
func traceID(tp string) string {
	parts := strings.Split(tp, "-")
	if len(parts) < 4 || len(parts[1]) != 32 {
		return ""
	}
	return parts[1]
}
