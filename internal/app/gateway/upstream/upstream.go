// Package upstream is the gateway's HTTP/1.1 client of instances, on its
// fast stack (internal/app/gateway): a keep-alive pool of connections per
// instance address, on fasthttp's request writer and response parser.
// One sweeper goroutine, which Client.Start starts and Client.Close stops, closes the
// connections idle past the idle timeout, as net/http's transport does, and
// drops the pools that have had neither a request nor an idle connection
// for as long (those of instances that left); a pool starts no goroutine of
// its own. The pool bounds each write of a request (the upstream write
// timeout, netbound), the wait for the response headers (the
// response-header timeout) and each read of the response body (the upstream
// read timeout, upConn.Read), hands
// 1xx answers to the client as they come, reads the answer while a request
// body that streams is written (roundTripStream), and streams an answer
// body that is large or of unknown length.
//
// It is written here rather than taken from fasthttp.HostClient, which
// does the same job in the library, because HostClient does not fit the
// routed call: it drops 1xx answers (Early Hints would not reach the
// client), retries idempotent requests on its own beneath the routed call
// (a retry must go to another instance and be reported), and keeps a
// goroutine that cleans idle connections for up to its idle time after the
// gateway closes. The wire format is still fasthttp's: requests are
// written by fasthttp.Request and answers parsed by fasthttp.Response.
//
// Its API has the shape of a RoundTripper (Client.RoundTrip), so that the
// client can be measured, replaced or removed in one place; it knows
// nothing of the gateway's rules, which reach it through Call: the
// request's body as it streams from the client (Body), where the 1xx
// answers go (Interim), and who is told of an answer that stalls (OnStall).
package upstream

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httputil"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/lanesdev/lanes/internal/lib/addrpolicy"
	"github.com/lanesdev/lanes/internal/lib/cowmap"
	"github.com/lanesdev/lanes/internal/lib/netbound"
)

const (
	// MaxBufferedBody is the largest response body of known length read
	// whole before it is written; larger ones, and chunked ones, stream.
	MaxBufferedBody = 1 << 20
	// upBufSize is the size of each upstream connection's read and write
	// buffers; the read buffer holds a response head whole.
	upBufSize = MaxResponseHead
	// MaxResponseHead bounds the head of an instance's answer (its status
	// line and header fields, with their line ends; each 1xx head on its
	// own) on either HTTP/1.1 stack, as maxHeaderBytes bounds a request's:
	// the fast path parses a head in its upstream read buffer, and the
	// net/http path's transport is given the same bound
	// (MaxResponseHeaderBytes). A longer head fails the attempt with
	// ErrResponseHeadTooLarge (502 upstream, logged, and a failure for
	// outlier detection), as nginx refuses an upstream's head larger than
	// its proxy_buffer_size.
	MaxResponseHead = 16 << 10
)

// ErrResponseHeadTooLarge is an answer whose head is over MaxResponseHead.
var ErrResponseHeadTooLarge = fmt.Errorf("the instance's response head is over %d bytes (the gateway's limit)", MaxResponseHead)

// headTooLarge reports whether err, reading an answer's head, says that
// it is over MaxResponseHead: fasthttp's parser found it larger than the
// read buffer.
func headTooLarge(err error) bool {
	var small *fasthttp.ErrSmallBuffer
	return errors.As(err, &small)
}

// Body is a request body that streams from the client while the attempt
// writes it (the gateway's keptBody).
type Body interface {
	io.Reader
	// Size is the body's length as the client framed it, or -1 (chunked).
	Size() int
	// Started reports whether any of it was read: it cannot be sent again.
	Started() bool
	// Failed is the error reading it from the client broke on, if any.
	Failed() error
	// Cut ends the body's reads: the one in flight and every later one fail
	// at once (the instance answered before the end of the upload). A read
	// that a cut ended is no failure of the client's (Failed).
	Cut()
}

// Interim is where the 1xx answers of an attempt go (but 101), as they
// come: Interim writes the head h to the client, or fails the attempt.
type Interim interface {
	Interim(h *fasthttp.ResponseHeader) error
}

// Call is what an attempt needs besides its request.
type Call struct {
	// HeaderTimeout bounds the wait for the answer's head, from the end of
	// the request's write; 0 for none.
	HeaderTimeout time.Duration
	// Interim takes the 1xx answers; nil drops them (an HTTP/1.0 client).
	Interim Interim
	// Body is the request's body when it streams from the client; nil
	// when the request holds it whole, or has none.
	Body Body
}

// Options are a Client's settings; a timeout of 0 is none.
type Options struct {
	// MaxIdlePerHost bounds the idle connections kept per instance.
	MaxIdlePerHost int
	// IdleTimeout is how long an idle connection, and a pool without
	// requests, are kept.
	IdleTimeout time.Duration
	// WriteTimeout bounds each write of a request (netbound).
	WriteTimeout time.Duration
	// ReadTimeout bounds each read of an answer's body.
	ReadTimeout time.Duration
	// Dial are the rules of the addresses dialled.
	Dial *addrpolicy.Rules
}

// New returns a client with the settings o. Start starts its sweeper.
func New(o Options) *Client {
	return newUpstreams(o.MaxIdlePerHost, o.IdleTimeout, o.WriteTimeout, o.ReadTimeout, o.Dial)
}

// RoundTrip sends req to the instance at addr and reads its answer into
// resp: 1xx answers (but 101) go to call.Interim as they come, the final
// answer's body is read whole when small and of known length, else it
// streams (resp.BodyStream; the connection goes back to its pool once the
// body is read through and closed). unsent reports an error before any
// byte of req left: the request may go to another instance as it is.
func (u *Client) RoundTrip(addr string, req *fasthttp.Request, resp *fasthttp.Response, call Call) (unsent bool, err error) {
	return u.pool(addr).do(req, resp, call.HeaderTimeout, call.Interim, call.Body)
}

// Start starts the sweeper of idle connections, unless it runs, the
// client is closed or there is no idle timeout.
func (u *Client) Start() { u.startSweeper() }

// CloseIdleConnections closes the idle connections.
func (u *Client) CloseIdleConnections() { u.closeIdle(false) }

// Close closes every connection, idle or in use (which ends the attempts on
// them), and closes the ones that come back later; it stops the sweeper
// and waits for it.
func (u *Client) Close() {
	u.closeIdle(true)
	u.stopSweeper()
}

// WrapDial has the dials of c go through wrap, given the dial it replaces
// (a test taps the connections). Call it before the first RoundTrip.
func (u *Client) WrapDial(wrap func(dial func(network, addr string) (net.Conn, error)) func(network, addr string) (net.Conn, error)) {
	u.dial = wrap(u.dial)
}

// InUse is the number of connections to addr in use.
func (u *Client) InUse(addr string) int {
	p := u.pool(addr)
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out
}

// Pooled reports whether the client keeps a pool for addr (the sweeper drops
// the pools unused for the idle timeout).
func (u *Client) Pooled(addr string) bool {
	_, ok := u.m.Load(addr)
	return ok
}

// OnStall has f told, once, of a read of resp's body that the read timeout
// ended (the answer's head has gone to the client): resp is an answer that
// RoundTrip streams. f outlives the attempt, as the body does.
func OnStall(resp *fasthttp.Response, f func(*ReadTimeoutError)) {
	if b, ok := resp.BodyStream().(*upBody); ok {
		b.stall = f
	}
}

// Rewind puts a body that streams back on req for an attempt (writing the
// request takes it off), unless an attempt read some of it; a body that
// does not stream (b nil) needs nothing.
func Rewind(b Body, req *fasthttp.Request) bool {
	if b == nil {
		return true
	}
	if b.Started() {
		return false
	}
	req.SetBodyStream(b, b.Size())
	return true
}

// interimStatus reports whether an answer of status code is one that goes
// on to the client before the final one (103 Early Hints, say): a 1xx, but
// 101, which is final.
func interimStatus(code int) bool {
	return code >= 100 && code < 200 && code != fasthttp.StatusSwitchingProtocols
}

// Client is the keep-alive pools of a gateway to its instances, one per
// instance address.
type Client struct {
	m           cowmap.Map[string, *upPool]
	mu          sync.Mutex    // guards closed and the sweeper; outside m's own lock
	idle        int           // idle connections kept per pool
	idleTimeout time.Duration // Config.UpstreamIdleTimeout: an idle connection, and a pool without requests, last that long; 0: forever
	write       time.Duration // the upstream write timeout, 0 for none
	read        time.Duration // the upstream read timeout, 0 for none
	// dial is a net.Dialer's Dial, with the gateway's address rules (tests
	// tap it).
	dial   func(network, addr string) (net.Conn, error)
	closed bool
	// The sweeper (sweep), while it runs: stop cancels it, done closes
	// when it has returned.
	stop context.CancelFunc
	done chan struct{}
}

func newUpstreams(idle int, idleTimeout, writeTimeout, readTimeout time.Duration, rules *addrpolicy.Rules) *Client {
	return &Client{idle: idle, idleTimeout: idleTimeout, write: writeTimeout, read: readTimeout,
		dial: rules.Dialer(&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).Dial}
}

// startSweeper starts the sweeper unless it runs or the pools are closed.
// It sweeps every tenth of the idle timeout, so that an idle connection is
// closed within a tenth more than the timeout.
func (u *Client) startSweeper() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.stop != nil || u.closed || u.idleTimeout == 0 {
		return // without an idle timeout, nothing expires
	}
	ctx, stop := context.WithCancel(context.Background())
	u.stop, u.done = stop, make(chan struct{})
	every := max(u.idleTimeout/10, time.Millisecond)
	go func(done chan struct{}) {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				u.sweep(now)
			}
		}
	}(u.done)
}

// stopSweeper stops the sweeper and waits for it to return.
func (u *Client) stopSweeper() {
	u.mu.Lock()
	stop, done := u.stop, u.done
	u.stop, u.done = nil, nil
	u.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

// sweep closes the connections idle since before now less the idle
// timeout, and drops the pools that have had no request since then and
// keep no connection.
func (u *Client) sweep(now time.Time) {
	var gone []string
	for addr, p := range u.m.All() {
		if p.sweep(now, u.idleTimeout) {
			gone = append(gone, addr)
		}
	}
	if len(gone) == 0 {
		return
	}
	u.m.Update(func(next map[string]*upPool) {
		for _, addr := range gone {
			delete(next, addr)
		}
	})
}

// pool returns the pool of the instance at addr.
func (u *Client) pool(addr string) *upPool {
	if p, ok := u.m.Load(addr); ok {
		return p
	}
	u.mu.Lock() // closed stays as it is while the pool is made
	defer u.mu.Unlock()
	p, _ := u.m.LoadOrStore(addr, func() *upPool {
		return &upPool{addr: addr, u: u, closed: u.closed, final: u.closed, last: time.Now()}
	}, 0)
	return p
}

// closeIdle closes every idle connection, and with final marks the pools
// closed: a connection that comes back later is closed.
func (u *Client) closeIdle(final bool) {
	u.mu.Lock()
	if final {
		u.closed = true
	}
	var ps []*upPool
	for _, p := range u.m.All() {
		ps = append(ps, p)
	}
	u.mu.Unlock()
	for _, p := range ps {
		p.closeIdle(final)
	}
}

// upPool is the keep-alive pool of one instance address.
type upPool struct {
	addr   string
	u      *Client
	mu     sync.Mutex
	idle   []*upConn // most recently used last
	out    int       // connections in use
	busy   *upConn   // the connections in use, linked (upConn.prev, next)
	final  bool      // closed by the gateway's Close, not the sweeper
	last   time.Time // the last get or put
	closed bool
}

// upConn is one upstream connection.
type upConn struct {
	c     net.Conn
	br    *bufio.Reader // reads through the upConn (Read)
	bw    *bufio.Writer // writes through w
	w     netbound.Writer
	used  time.Time // when it went idle
	armed time.Time // the read deadline set on c, zero for none
	// body is the upstream read timeout while the answer's body is read
	// (each read of c within it), 0 while its head is (or for none).
	body time.Duration
	// prev and next link c into its pool's connections in use, under the
	// pool's mutex.
	prev, next *upConn
	idle       idleCheck
}

// The writes of a request to an instance, and of an answer to a client,
// are bounded by the upstream and client write timeouts (netbound): an
// instance that takes nothing of a write for that long (hung, paused with
// SIGSTOP, or not reading an upload) fails it, as nginx's
// proxy_send_timeout bounds the time between two writes. Both HTTP/1.1
// paths write requests through one: the fast path's upstream connections
// (upConn) and the net/http path's transport (netbound.Conn); and answers
// to clients alike (prefixConn, clientListener).
var (
	InstanceWrites = &netbound.Names{Peer: "instance", What: "request", Setting: "upstream write timeout"}
)

// ReadTimeoutError is a read of an answer's body from an instance that sent
// nothing of it within the upstream read timeout, on either HTTP/1.1 stack.
type ReadTimeoutError struct {
	D   time.Duration // the upstream read timeout
	Err error         // the read's own error
}

func (e *ReadTimeoutError) Error() string {
	return fmt.Sprintf("the instance sent none of the answer's body for %s (the upstream read timeout)", e.D)
}
func (e *ReadTimeoutError) Unwrap() error { return e.Err }
func (e *ReadTimeoutError) Timeout() bool { return true }

// Read reads c's connection for its read buffer. While the answer's body is
// read (c.body), each read is bounded by the upstream read timeout, as
// nginx's proxy_read_timeout bounds the time between two reads: an instance
// that sends nothing of the body for that long fails the read with a
// *ReadTimeoutError. The deadline is kept as the write bound keeps its own
// (netbound.Keep).
func (c *upConn) Read(p []byte) (int, error) {
	if c.body > 0 {
		c.readDeadline(time.Now(), c.body)
	}
	n, err := c.c.Read(p)
	if err != nil && c.body > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
		err = &ReadTimeoutError{D: c.body, Err: err}
	}
	return n, err
}

// readDeadline bounds the next reads of c, from now, by d: the wait for
// the answer's headers (the response-header timeout), or each read of its
// body (the upstream read timeout, Read). A read deadline already set that
// falls at most netbound.Slack(d) before now+d is kept, so that a busy
// connection sets one about once a second rather than twice a request
// (setting one is a runtime timer update). The wait is thus bounded by d,
// and lasts at least d less the slack.
func (c *upConn) readDeadline(now time.Time, d time.Duration) {
	want := now.Add(d)
	if netbound.Keep(c.armed, want, d) {
		return
	}
	c.c.SetReadDeadline(want)
	c.armed = want
}

// noDeadline removes the read deadline of c.
func (c *upConn) noDeadline() {
	if !c.armed.IsZero() {
		c.c.SetReadDeadline(time.Time{})
		c.armed = time.Time{}
	}
}

func (c *upConn) close() { c.c.Close() }

// answered reports whether the instance has sent any of an answer, waiting
// up to d for it.
func (c *upConn) answered(d time.Duration) bool {
	if c.br.Buffered() > 0 {
		return true
	}
	c.armed = time.Now().Add(d)
	c.c.SetReadDeadline(c.armed)
	_, err := c.br.Peek(1)
	return err == nil
}

// unsentError is a dial that failed: nothing was sent.
type unsentError struct{ err error }

func (e *unsentError) Error() string { return e.err.Error() }
func (e *unsentError) Unwrap() error { return e.err }

// get returns an idle connection, or a new one (reused false). An idle
// connection on which the instance has sent anything since its last answer
// (idleCheck), or which it has closed, is closed and not used: those bytes
// are no answer to the request about to be sent (an instance that answers
// twice, or late), and it would read them as its own; net/http's transport
// closes such a connection as the bytes come (its connections are always
// read), as nginx does.
func (p *upPool) get(now time.Time) (c *upConn, reused bool, err error) {
	p.mu.Lock()
	p.last = now
	for len(p.idle) > 0 {
		c = p.idle[len(p.idle)-1]
		p.idle[len(p.idle)-1] = nil
		p.idle = p.idle[:len(p.idle)-1]
		if p.u.idleTimeout > 0 && now.Sub(c.used) >= p.u.idleTimeout {
			c.close()
			continue
		}
		p.take(c)
		p.mu.Unlock()
		if !c.idle.spoiled() {
			return c, true, nil
		}
		p.discard(c)
		p.mu.Lock()
	}
	p.out++
	p.mu.Unlock()
	nc, err := p.u.dial("tcp", p.addr)
	if err != nil {
		p.mu.Lock()
		p.out--
		p.mu.Unlock()
		return nil, false, &unsentError{err}
	}
	c = &upConn{c: nc, w: netbound.Writer{C: nc, D: p.u.write, Names: InstanceWrites}}
	c.idle.init(nc)
	c.br = bufio.NewReaderSize(c, upBufSize)
	c.bw = bufio.NewWriterSize(&c.w, upBufSize)
	p.mu.Lock()
	p.out--
	p.take(c)
	if p.final {
		// Closed by Close while it dialed: it would escape Close.
		p.release(c)
		p.mu.Unlock()
		c.close()
		return nil, false, errPoolClosed
	}
	p.mu.Unlock()
	return c, false, nil
}

// errPoolClosed is an attempt that the gateway's Close cut short.
var errPoolClosed = errors.New("the gateway is closing")

// take counts c in use and links it; p.mu is held.
func (p *upPool) take(c *upConn) {
	p.out++
	c.prev, c.next = nil, p.busy
	if p.busy != nil {
		p.busy.prev = c
	}
	p.busy = c
}

// release unlinks c, in use no more; p.mu is held.
func (p *upPool) release(c *upConn) {
	p.out--
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		p.busy = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	}
	c.prev, c.next = nil, nil
}

// put keeps c, idle since now, for the next request, or closes it. A
// connection that holds bytes past the answer just read through is closed:
// those bytes are no answer to any request (a body longer than its
// Content-Length, a body after a 204, 304 or the answer to a HEAD, a second
// answer), and the next request on it would read them as its own, another
// client's maybe, in another lane; net/http's transport closes such a
// connection too ("Unsolicited response received on idle HTTP channel"),
// as nginx does one whose instance "sent more data than specified".
func (p *upPool) put(c *upConn, now time.Time) {
	c.used = now
	p.mu.Lock()
	p.last = now
	p.release(c)
	if p.closed || len(p.idle) >= p.u.idle || c.br.Buffered() > 0 {
		p.mu.Unlock()
		c.close()
		return
	}
	p.idle = append(p.idle, c)
	p.mu.Unlock()
}

// discard closes c, a connection of p in use that does not come back.
func (p *upPool) discard(c *upConn) {
	p.mu.Lock()
	p.release(c)
	p.mu.Unlock()
	c.close()
}

// sweep closes the connections idle since before now less timeout and
// reports whether the pool is done with: no connection kept or in use, and
// no request since then. A pool done with is closed (a connection that comes back to
// it is closed) and is the caller's to drop.
func (p *upPool) sweep(now time.Time, timeout time.Duration) (done bool) {
	p.mu.Lock()
	n := 0 // the expired ones, the least recently used, come first
	for n < len(p.idle) && now.Sub(p.idle[n].used) >= timeout {
		n++
	}
	expired := p.idle[:n:n]
	if n > 0 {
		p.idle = append(make([]*upConn, 0, cap(p.idle)), p.idle[n:]...)
	}
	if len(p.idle) == 0 && p.out == 0 && now.Sub(p.last) >= timeout {
		p.closed, done = true, true
	}
	p.mu.Unlock()
	for _, c := range expired {
		c.close()
	}
	return done
}

// closeIdle closes the idle connections; with final it marks the pool
// closed and closes the connections in use too, which ends the attempts
// on them (an instance that stalls mid-answer would hold them, and Close
// waits for them).
func (p *upPool) closeIdle(final bool) {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	if final {
		p.closed, p.final = true, true
		for c := p.busy; c != nil; c = c.next {
			c.c.Close() // its user discards it
		}
	}
	p.mu.Unlock()
	for _, c := range idle {
		c.close()
	}
}

// errHeaderTimeout is an instance that did not start its answer within the
// response-header timeout.
var errHeaderTimeout = errors.New("timeout awaiting response headers")

// do sends req to the instance and reads the answer into resp: 1xx answers
// (but 101) are written to the client of ctx (nil for none) as they come, the final
// answer's body is read whole when small and of known length, else streamed
// into resp (the connection goes back to the pool once the body is read
// through). unsent reports an error before any byte of req left. A request
// on a reused connection that the instance had closed, which got no byte of
// answer, is sent once more on a new connection, as net/http's transport
// does, unless its body streams from the client (body) and some of it was
// read: that is not sent twice.
func (p *upPool) do(req *fasthttp.Request, resp *fasthttp.Response, headerTimeout time.Duration, to1xx Interim, body Body) (unsent bool, err error) {
	for try := 0; ; try++ {
		now := time.Now()
		c, reused, err := p.get(now)
		if err != nil {
			return true, err
		}
		retry, err := p.roundTrip(c, req, resp, now, headerTimeout, to1xx, body)
		if err == nil {
			return false, nil
		}
		p.discard(c)
		if retry && reused && try == 0 && Rewind(body, req) {
			resp.Reset()
			continue
		}
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return false, err
	}
}

// roundTrip is one exchange on c; on an error c is the caller's to discard.
// retry reports an error of a connection that gave no byte of answer.
// now is when the exchange started: the deadline for the answer's headers
// counts from it, and the connection counts as idle from it when it comes
// back (sooner than it is). A request whose body streams from the client
// (body) is sent by roundTripStream, which reads the answer as it writes.
func (p *upPool) roundTrip(c *upConn, req *fasthttp.Request, resp *fasthttp.Response, now time.Time, headerTimeout time.Duration, to1xx Interim, body Body) (retry bool, err error) {
	c.body = 0 // the head first
	if body != nil {
		return p.roundTripStream(c, req, resp, headerTimeout, to1xx, body)
	}
	werr := req.Write(c.bw)
	if werr == nil {
		werr = c.bw.Flush()
	}
	if werr != nil {
		look, slack, again := afterWrite(werr, req, nil)
		if !look || slack > 0 && !c.answered(slack) {
			return again, werr
		}
		// The connection is not used again; an answer that does not come
		// whole fails the attempt with the write's error.
		req.Header.SetConnectionClose()
		defer func() {
			if err != nil {
				req.Header.ResetConnectionClose()
				retry, err = again, werr
			}
		}()
	}
	if headerTimeout > 0 {
		c.readDeadline(now, headerTimeout)
	} else {
		c.noDeadline()
	}
	if retry, err := readHead(c, resp, to1xx); err != nil {
		return retry, err
	}
	return false, p.readAnswer(c, req, resp, now)
}

// afterWrite is the rule for an attempt whose write of req failed with
// werr (body: the request's body that streams, if any). The instance may
// have answered before it stopped taking the request (a 401 or 413 to an
// upload it refuses), and then closed its side, reset the connection or
// stopped reading; that answer stands, as net/http's transport takes it.
// look reports whether one is looked for: after the instance closed or
// reset the connection (within the response-header timeout), or took none
// of a write for the upstream write timeout (then the answer must have
// begun within slack); not when the client's body failed. Else, or when
// none comes, the attempt fails with werr, and again reports whether it
// may be sent once more on a new connection: not after a write that timed
// out, since the instance that did not take it is hung, or reads nothing
// more of this request.
func afterWrite(werr error, req *fasthttp.Request, body Body) (look bool, slack time.Duration, again bool) {
	usable := (body == nil || body.Failed() == nil) && !req.Header.ConnectionClose()
	var wt *netbound.TimeoutError
	if errors.As(werr, &wt) {
		return usable, netbound.Slack(wt.D), false
	}
	return usable && peerClosed(werr), 0, true
}

// readHead reads the head of the instance's answer into resp. 1xx answers
// (but 101) go on to the client of ctx as they come, until the final one;
// with ctx nil (an HTTP/1.0 client, RFC 9110 15.2) they are read and
// dropped. retry reports an error of a
// connection that gave no byte of answer.
func readHead(c *upConn, resp *fasthttp.Response, to1xx Interim) (retry bool, err error) {
	for first := true; ; first = false {
		if err := resp.Header.Read(c.br); err != nil {
			var ne net.Error
			if errors.Is(err, fasthttp.ErrTimeout) || errors.As(err, &ne) && ne.Timeout() {
				return false, errHeaderTimeout
			}
			if headTooLarge(err) {
				return false, ErrResponseHeadTooLarge
			}
			return first && c.br.Buffered() == 0, err
		}
		// The head goes to the client in the gateway's HTTP/1.1, which
		// frames the body, whatever the instance's version: with the
		// instance's own status line ("HTTP/1.0 200 OK") the client would
		// read a chunked body as one that ends when the connection does,
		// which the gateway keeps open, and take the next answer on it as
		// more of this one.
		resp.Header.SetProtocol(nil)
		if !interimStatus(resp.StatusCode()) {
			return false, nil
		}
		if to1xx != nil {
			if err := to1xx.Interim(&resp.Header); err != nil {
				return false, err
			}
		}
	}
}

// readAnswer reads the body of the answer whose head is in resp: whole
// when small and of known length, else as a stream (upBody) that gives the
// connection back once it is read through.
func (p *upPool) readAnswer(c *upConn, req *fasthttp.Request, resp *fasthttp.Response, now time.Time) error {
	// The body is not bounded by the header deadline: each read of it from
	// the connection is bounded by the upstream read timeout instead
	// (Read), or by nothing (a body that came with the headers, already
	// buffered, needs no read).
	c.body = p.u.read
	code := resp.StatusCode()
	if code == fasthttp.StatusSwitchingProtocols {
		// The fast path serves no upgrade (classify): what follows on the
		// connection is no HTTP answer.
		return &SwitchError{Got: string(resp.Header.Peek("Upgrade"))}
	}
	if req.Header.IsHead() || code == fasthttp.StatusNoContent || code == fasthttp.StatusNotModified {
		resp.SkipBody = true
		p.done(c, req, resp, now)
		return nil
	}
	n := resp.Header.ContentLength()
	if n >= 0 && n <= MaxBufferedBody {
		if c.br.Buffered() < n && c.body == 0 {
			c.noDeadline()
		}
		if err := resp.ReadBody(c.br, 0); err != nil {
			var rt *ReadTimeoutError
			if errors.As(err, &rt) {
				err = rt // in its own words, whatever the parser made of it
			}
			return err
		}
		p.done(c, req, resp, now)
		return nil
	}
	// Stream the rest: chunked, unknown length (until close) or large.
	if c.body == 0 {
		c.noDeadline()
	}
	resp.SetBodyStream(newUpBody(p, c, req, resp, n), n)
	return nil
}

// roundTripStream is roundTrip for a request whose body streams from the
// client (body): it reads the answer's head while it writes the request,
// as net/http's transport does, on a goroutine of its own (readHead),
// which it waits for before it returns. An instance may answer before it
// has read the body (a 401 from an auth check, a 413 to a body over its
// limit, a redirect) and then read no more of it, or close the connection
// (net/http's server reads at most 256 KiB of a body its handler left,
// nginx none): once the head of a final answer that refuses the request
// (300 and over) is in before the end of the body, the write stops
// (uploadCut), the rest of the body is not sent, and the answer goes to
// the client; the connection is not used again, and the client's closes
// after the answer, the rest of its body unread (fastStack.handle). An
// early 2xx does not stop the write: a full-duplex handler answers first
// and reads on, and gets the whole body, as from net/http's transport; the
// answer's body is read once the request is written. 1xx answers go on to the client as they come, during
// the upload too. The head is awaited without a deadline while the body
// streams (each write is bounded by the upstream write timeout, each read
// of the client's body by the client read timeout); the response-header timeout
// counts from the end of the write.
func (p *upPool) roundTripStream(c *upConn, req *fasthttp.Request, resp *fasthttp.Response, headerTimeout time.Duration, to1xx Interim, body Body) (retry bool, err error) {
	c.noDeadline()
	u := &uploadCut{body: body}
	u.up = cutConn{Conn: c.c, u: u}
	c.w.C = &u.up
	defer func() { c.w.C = c.c }()
	heads := make(chan headResult, 1)
	go func() {
		// Until it returns, the head's reads of c (c.br, and upConn.Read,
		// which leaves the read deadline alone while c.body is 0) and resp
		// are this goroutine's; this one only sets the read deadline.
		retry, err := readHead(c, resp, to1xx)
		if err != nil || resp.StatusCode() >= 300 {
			// A refusal (or a failed connection): the rest of the body
			// would go nowhere. A 2xx goes on taking the body (a
			// full-duplex handler), as net/http's transport writes on.
			u.stop()
		}
		heads <- headResult{retry, err}
	}()
	werr := req.Write(c.bw)
	if werr == nil {
		werr = c.bw.Flush()
	}
	cut := u.finish()
	now := time.Now() // the wait for the answer counts from the end of the write, as net/http's transport counts it
	look, again := false, true
	switch {
	case cut:
		// readHead has returned, or is about to.
	case werr == nil:
		if headerTimeout > 0 {
			c.readDeadline(now, headerTimeout)
		}
	default:
		var slack time.Duration
		look, slack, again = afterWrite(werr, req, body)
		switch {
		case !look:
			c.armed = now // ends the wait for a head at once
			c.c.SetReadDeadline(now)
		case slack > 0:
			c.readDeadline(now, slack)
		case headerTimeout > 0:
			c.readDeadline(now, headerTimeout)
		}
	}
	h := <-heads
	switch {
	case cut && h.err == nil:
		// The answer came before the end of the body.
	case cut || werr == nil:
		if h.err != nil {
			return h.retry, h.err
		}
		return false, p.readAnswer(c, req, resp, now)
	case !look || h.err != nil:
		return again, werr
	}
	// The connection, mid-request, is not used again; an answer that does
	// not come whole fails the attempt (after a failed write, with its
	// error).
	req.Header.SetConnectionClose()
	if err := p.readAnswer(c, req, resp, now); err != nil {
		req.Header.ResetConnectionClose()
		if !cut {
			return again, werr
		}
		return false, err
	}
	return false, nil
}

// headResult is how readHead ended, on roundTripStream's goroutine.
type headResult struct {
	retry bool
	err   error
}

// uploadCut stops the write of a request whose body streams
// (roundTripStream) once the instance has answered, or its connection has
// failed, before the end of the body: it cuts the body (Body.Cut: its reads
// from the client fail at once) and sets the instance connection's write
// deadline to now. The write sets that deadline before each write through
// it (upConn.w), so that one set after the cut cannot undo it.
type uploadCut struct {
	mu   sync.Mutex
	done bool // the write has returned: nothing to cut
	cut  bool
	body Body
	up   cutConn // the instance's
}

// stop cuts the write, unless it has returned.
func (u *uploadCut) stop() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.done || u.cut {
		return
	}
	u.cut = true
	u.body.Cut()
	u.up.Conn.SetWriteDeadline(time.Now())
}

// finish marks the write returned, and reports whether it was cut.
func (u *uploadCut) finish() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.done = true
	return u.cut
}

// cutConn is the instance's connection while a request whose body streams
// is written to it: its write deadline is now once the write is cut.
type cutConn struct {
	net.Conn
	u *uploadCut
}

func (c *cutConn) SetWriteDeadline(t time.Time) error {
	c.u.mu.Lock()
	defer c.u.mu.Unlock()
	if c.u.cut {
		t = time.Now()
	}
	return c.Conn.SetWriteDeadline(t)
}

// peerClosed reports whether err, writing to an instance, says that it
// closed the connection (or reset it).
func peerClosed(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}

// done returns c to the pool after a whole exchange, unless either side
// closes it.
func (p *upPool) done(c *upConn, req *fasthttp.Request, resp *fasthttp.Response, now time.Time) {
	if req.Header.ConnectionClose() || resp.Header.ConnectionClose() {
		p.discard(c)
		return
	}
	p.put(c, now)
}

// SwitchError is a 101 Switching Protocols answer to a request that did
// not ask to switch to that protocol (asked is its Upgrade, "" for none),
// on either HTTP/1.1 stack: the attempt fails (502 upstream) and the
// connection, on which the instance speaks another protocol, is closed.
// (httputil.ReverseProxy refuses it too, but leaves the connection open.)
type SwitchError struct{ Asked, Got string }

func (e *SwitchError) Error() string {
	if e.Asked == "" {
		return fmt.Sprintf("the instance switched protocols (to %q) on a request that asked for no upgrade", e.Got)
	}
	return fmt.Sprintf("the instance switched protocols to %q when %q was asked", e.Got, e.Asked)
}

// upBody streams a response body from its upstream connection, and gives
// the connection back when it is read through.
type upBody struct {
	p       *upPool
	c       *upConn
	r       io.Reader
	reuse   bool // the connection may serve another request
	chunked bool
	eof     bool
	closed  bool
	// stall is told of a read that the upstream read timeout ended (the
	// answer's head has gone to the client), once; nil before the attempt
	// returns (OnStall).
	stall func(*ReadTimeoutError)
}

func newUpBody(p *upPool, c *upConn, req *fasthttp.Request, resp *fasthttp.Response, n int) *upBody {
	b := &upBody{p: p, c: c, reuse: !req.Header.ConnectionClose() && !resp.Header.ConnectionClose()}
	switch {
	case n == -1:
		b.r, b.chunked = newChunkedReader(c.br, &resp.Header), true
	case n >= 0:
		b.r = &io.LimitedReader{R: c.br, N: int64(n)}
	default: // until the connection closes
		b.r, b.reuse = c.br, false
	}
	return b
}

func (b *upBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF && b.stall != nil {
		var rt *ReadTimeoutError
		if errors.As(err, &rt) {
			b.stall(rt)
			b.stall = nil
		}
	}
	if err == io.EOF {
		if lr, ok := b.r.(*io.LimitedReader); ok && lr.N > 0 {
			return n, io.ErrUnexpectedEOF // the instance closed early
		}
		b.eof = true
	}
	return n, err
}

func (b *upBody) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	if b.eof && b.reuse {
		b.p.put(b.c, time.Now())
	} else {
		b.p.discard(b.c)
	}
	return nil
}

// chunkedReader decodes a chunked body (httputil's decoder) and then reads
// the trailer section, which the decoder leaves, into the response's
// trailers, which the fast path's server writes after the body.
type chunkedReader struct {
	br   *bufio.Reader
	r    io.Reader
	resp *fasthttp.ResponseHeader
	err  error
}

func newChunkedReader(br *bufio.Reader, resp *fasthttp.ResponseHeader) *chunkedReader {
	return &chunkedReader{br: br, r: httputil.NewChunkedReader(br), resp: resp}
}

func (c *chunkedReader) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.r.Read(p)
	if err == io.EOF {
		if terr := c.resp.ReadTrailer(c.br); terr != nil {
			err = terr
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
		}
	}
	c.err = err
	return n, err
}
