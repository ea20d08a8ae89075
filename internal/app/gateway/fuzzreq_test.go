package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/smuggletest"
)

// FuzzSmuggling sends arbitrary bytes to the gateway on one TCP connection
// (then ends the client's side of it) and checks what the gateway sends its
// instance (a smuggletest.Recorder) against what RFC 9112 says the bytes
// are:
//
//   - what the gateway writes on each upstream connection (tapped at its
//     dialers) is whole requests, each framed one way only (one
//     Content-Length of digits, or Transfer-Encoding: chunked alone, with
//     well-formed chunks), with CRLF line ends, header names that are
//     tokens and no CR, LF or NUL in a value; the last request on a
//     connection may be cut short only if the gateway closed it;
//   - the requests it sent whole are, in order, some of the requests that
//     a strict reading of the client's bytes finds (same method, same
//     body): the gateway may refuse any of them, never read one otherwise. Where that reading stops, on a request RFC 9112 says
//     must be refused (whitespace before a colon, a missing or second
//     Host, an invalid Content-Length, a final transfer coding other than
//     chunked), nothing more reaches the instance; on one whose framing is
//     faulty (Transfer-Encoding with Content-Length or in HTTP/1.0, a
//     broken chunk), at most that one request; after a request that ends
//     the connection (Connection: close, HTTP/1.0 without keep-alive) or
//     the end of the bytes, nothing; after what the RFC leaves open or the
//     reading does not model (a request line that is not three words of a
//     token method, a target without control characters and HTTP/1.0 or
//     1.1; CONNECT; a field line without a colon or a name), nothing more
//     is checked but the upstream framing;
//   - the gateway closes the connection once the client has ended its
//     side, and still serves a new one.
//
// Where the RFC lets a recipient either refuse or take the bytes one way,
// the strict reading takes them that way, and the gateway may refuse them:
// a bare LF as a line end, empty lines before the request line as nothing,
// a bare CR or a NUL in a field line, and obs-fold, as SP, a
// whitespace-preceded line after the request line as nothing, equal
// Content-Length values as one, codings before a final chunked as chunked
// (RFC 9112 2.2, 5.2, 6.1, RFC 9110 5.5, 8.6); a gateway that reads any of
// them another way fails.
func FuzzSmuggling(f *testing.F) {
	for _, c := range smuggletest.Cases {
		if len(c.Raw) <= maxFuzzInput {
			f.Add([]byte(c.Raw + smuggletest.End))
		}
	}
	for _, s := range framingSeeds {
		f.Add([]byte(s))
	}
	var worlds [len(stacks)]*smugglingWorld
	for i, s := range stacks {
		worlds[i] = newSmugglingWorld(f, s)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(raw) > maxFuzzInput {
			t.Skip("over maxFuzzInput")
		}
		for i, s := range stacks {
			t.Run("http1="+s, func(t *testing.T) { worlds[i].exec(t, raw) })
		}
	})
}

// smugglingWorld is FuzzSmuggling's gateway on one stack, its recording
// instance and the tap of its upstream connections.
type smugglingWorld struct {
	w   *world
	rec *smuggletest.Recorder
	tap wireTap
}

func newSmugglingWorld(f *testing.F, stack string) *smugglingWorld {
	sw := new(smugglingWorld)
	sw.w = newWorldWith(f, "", Config{HTTP1: stack}, sw.tap.install)
	// The instance reads each request whole before it answers: the
	// gateway has written all of it by then.
	rec, err := smuggletest.NewRecorder()
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { rec.Close() })
	sw.w.register(f, "orders", "rec", rec.Addr, "")
	sw.rec = rec
	return sw
}

// exec sends raw to the gateway and checks what went upstream.
func (sw *smugglingWorld) exec(t *testing.T, raw []byte) {
	w, rec, tap := sw.w, sw.rec, &sw.tap
	rec.Reset()
	tap.reset()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := sendRaw(ctx, w.addr, raw); err != nil {
		t.Fatalf("sending %q: %v", trim(raw), err)
	}
	// The gateway closed the connection; its handlers may still be
	// returning (HTTP/2).
	if w.gw.inflight.Load() != 0 {
		eventually(t, "the gateway's handlers to return", func() bool { return w.gw.inflight.Load() == 0 })
	}
	sent, upRaw, err := readSent(tap.snapshot())
	if err != nil {
		t.Fatalf("client bytes %q: upstream: %v", trim(raw), err)
	}
	if err := checkForwarded(raw, sent); err != nil {
		t.Fatalf("client bytes %q: %v\nupstream bytes: %q", trim(raw), err, upRaw)
	}
	probe(ctx, t, w.addr)
}

// maxFuzzInput bounds the inputs: a head over maxHeaderBytes, and a body
// that streams (over bufferedRequestBody), fit.
const maxFuzzInput = 64 << 10

// framingSeeds are keep-alive and pipelined sequences, beside the
// smuggletest cases.
var framingSeeds = []string{
	"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\nGET /c HTTP/1.1\r\nHost: x\r\n\r\n",
	"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\nHost: x\r\n\r\n" +
		"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /d HTTP/1.1\r\nHost: x\r\n\r\n",
	// A GET and a HEAD with a body: the body is not a request.
	"GET /a HTTP/1.1\r\nHost: x\r\nContent-Length: 35\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n" + smuggletest.End,
	"HEAD /a HTTP/1.1\r\nHost: x\r\nContent-Length: 35\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n" + smuggletest.End,
	// Refused by the gateway's own rules (an invalid lane) before it reads
	// the body, which it must still skip or close on.
	"POST /a HTTP/1.1\r\nHost: x\r\nX-Lane: a b\r\nContent-Length: 35\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n" + smuggletest.End,
	"POST /a HTTP/1.1\r\nHost: x\r\nX-Lane: a b\r\nTransfer-Encoding: chunked\r\n\r\n23\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n\r\n0\r\n\r\n" + smuggletest.End,
	// Transfer-Encoding: identity (RFC 2616's), which RFC 9112 refuses.
	"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n" + smuggletest.End,
	"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\nContent-Length: 35\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n" + smuggletest.End,
	// Connection: close and HTTP/1.0: nothing after them is read.
	"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET /a HTTP/1.0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /b HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
	// Expect: 100-continue, trailers (the fast path hands TE: trailers to
	// the net/http handler), a body that streams.
	"POST /a HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\nHost: x\r\n\r\n",
	"POST /a HTTP/1.1\r\nHost: x\r\nTE: trailers\r\nTrailer: X-T\r\nTransfer-Encoding: chunked\r\n\r\n5;e=\"v\"\r\nhello\r\n0\r\nX-T: t\r\n\r\n",
	"PUT /a HTTP/1.1\r\nHost: x\r\nContent-Length: 20000\r\n\r\n" + strings.Repeat("b", 20000) + "GET /b HTTP/1.1\r\nHost: x\r\n\r\n",
	// A body cut short by the end of the client's bytes.
	"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nhello",
	"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 20000\r\n\r\nhello",
	"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n",
	// Other request targets, which the fast path hands to net/http.
	"GET http://x/a HTTP/1.1\r\nHost: x\r\n\r\nOPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n" + smuggletest.End,
	// A whitespace-preceded line before the first field.
	"GET /a HTTP/1.1\r\n Transfer-Encoding: chunked\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello" + smuggletest.End,
	// A head over maxHeaderBytes.
	headOfSize(maxHeaderBytes+100) + smuggletest.End,
}

// sendRaw writes raw to the gateway at addr on a new connection, ends the
// client's side of it, and reads the answers until the gateway closes it.
func sendRaw(ctx context.Context, addr string, raw []byte) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	conn := c.(*net.TCPConn)
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	// The gateway may answer and close before it has read everything:
	// write concurrently, and ignore the write's error.
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		if _, err := conn.Write(raw); err == nil {
			conn.CloseWrite()
		}
	}()
	_, err = io.Copy(io.Discard, conn)
	conn.Close() // unblocks the writer
	<-wrote
	if err != nil && !isConnReset(err) {
		return fmt.Errorf("reading the answers (the gateway did not close the connection after the client's end?): %w", err)
	}
	return nil
}

func isConnReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && strings.Contains(op.Err.Error(), "reset")
}

// wireTap records what the gateway writes to its instances, on each
// upstream connection of either path, as it writes it: what it chose to
// send, synchronously, where what an instance reads lags behind.
type wireTap struct {
	mu    sync.Mutex
	conns []*tapConn
	seq   int // counts the writes, on every connection
}

// tapConn is an upstream connection, recorded.
type tapConn struct {
	net.Conn
	t      *wireTap
	sent   bytes.Buffer // under t.mu
	writes []tapWrite   // under t.mu
	closed bool         // under t.mu
}

// tapWrite is where a write starts in tapConn.sent, and its place among
// the writes on every connection.
type tapWrite struct{ at, seq int }

func (c *tapConn) Write(p []byte) (int, error) {
	c.t.mu.Lock()
	c.t.seq++
	c.writes = append(c.writes, tapWrite{c.sent.Len(), c.t.seq})
	c.sent.Write(p)
	c.t.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *tapConn) Close() error {
	c.t.mu.Lock()
	c.closed = true
	c.t.mu.Unlock()
	return c.Conn.Close()
}

func (t *wireTap) add(c net.Conn, err error) (net.Conn, error) {
	if err != nil {
		return c, err
	}
	tc := &tapConn{Conn: c, t: t}
	t.mu.Lock()
	t.conns = append(t.conns, tc)
	t.mu.Unlock()
	return tc, nil
}

// install taps the dialers of both stacks of g: the fast stack's pools and
// the net/http transport.
func (t *wireTap) install(g *Gateway) {
	if f := fastOf(g); f != nil {
		f.up.WrapDial(func(dial func(network, addr string) (net.Conn, error)) func(network, addr string) (net.Conn, error) {
			return func(network, addr string) (net.Conn, error) { return t.add(dial(network, addr)) }
		})
	}
	tr := g.std.h1.(*http.Transport)
	dialCtx := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return t.add(dialCtx(ctx, network, addr))
	}
}

// sentConn is what the gateway sent on one connection.
type sentConn struct {
	raw    []byte
	writes []tapWrite
	closed bool
}

// seq is the place among all writes of the byte at offset at.
func (c sentConn) seq(at int) int {
	i := sort.Search(len(c.writes), func(i int) bool { return c.writes[i].at > at })
	return c.writes[i-1].seq
}

// snapshot returns what was sent since the last reset, by connection.
func (t *wireTap) snapshot() []sentConn {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]sentConn, len(t.conns))
	for i, c := range t.conns {
		out[i] = sentConn{raw: bytes.Clone(c.sent.Bytes()), writes: slices.Clone(c.writes), closed: c.closed}
	}
	return out
}

// reset forgets what was sent, and the connections closed.
func (t *wireTap) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	open := t.conns[:0]
	for _, c := range t.conns {
		if !c.closed {
			c.sent.Reset()
			c.writes = c.writes[:0]
			open = append(open, c)
		}
	}
	clear(t.conns[len(open):])
	t.conns = open
}

// readSent reads what the gateway sent strictly: every request whole, in
// the order it began to send them (on one connection or another: the fast
// path hands some requests to the net/http path), and the bytes for
// messages. The gateway has finished with the client's connection: on a
// connection still open, its last request is whole.
func readSent(conns []sentConn) (whole []strictReq, raw []byte, err error) {
	type placed struct {
		seq int
		req strictReq
	}
	var all []placed
	defer func() {
		slices.SortFunc(all, func(a, b placed) int { return a.seq - b.seq })
		for _, p := range all {
			whole = append(whole, p.req)
		}
	}()
	for i, c := range conns {
		raw = append(raw, trim(c.raw)...)
		b := c.raw
		for len(b) > 0 {
			r := readStrict(b, true)
			if r.f == fWhole {
				all = append(all, placed{c.seq(len(c.raw) - len(b)), r.req})
				b = b[r.n:]
				continue
			}
			if r.f != fIncomplete {
				return nil, raw, fmt.Errorf("connection %d, at byte %d: %s: %q", i, len(c.raw)-len(b), r.why, trim(b))
			}
			if !c.closed {
				return nil, raw, fmt.Errorf("connection %d, at byte %d: a request cut short on a connection left open: %q", i, len(c.raw)-len(b), trim(b))
			}
			break
		}
	}
	return whole, raw, nil
}

// checkForwarded checks the requests the instance received whole, in order,
// against the strict reading of the client's bytes raw.
func checkForwarded(raw []byte, got []strictReq) error {
	reqs, end := readClient(raw)
	j := 0
	for _, r := range reqs {
		if j < len(got) && got[j].method == r.method && bytes.Equal(got[j].body, r.body) {
			j++
		}
	}
	extra := got[j:]
	allowed := 0
	switch end.f {
	case fLoose:
		return nil
	case fClose:
		allowed = 1
	}
	if len(extra) > allowed {
		return fmt.Errorf("the client's bytes are %d strict requests %s, then %s (%s); the instance received %d requests whole, of which %d are not among them: %s",
			len(reqs), describe(reqs), end.f, end.why, len(got), len(extra), describe(extra))
	}
	return nil
}

func describe(reqs []strictReq) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, r := range reqs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %q", r.method, trim(r.body))
	}
	b.WriteByte(']')
	return b.String()
}

// readClient reads the client's bytes strictly: the whole requests, in
// order, and how the reading ended.
func readClient(raw []byte) (reqs []strictReq, end readResult) {
	for len(raw) > 0 {
		r := readStrict(raw, false)
		if r.f != fWhole {
			return reqs, r
		}
		reqs = append(reqs, r.req)
		raw = raw[r.n:]
		if r.req.last {
			return reqs, readResult{f: fLast, why: "a request that ends the connection"}
		}
	}
	return reqs, readResult{f: fLast, why: "the end of the client's bytes"}
}

// probe checks that the gateway serves a normal request on a new
// connection.
func probe(ctx context.Context, t *testing.T, addr string) {
	t.Helper()
	res := smuggletest.Send(ctx, addr, smuggletest.Case{Raw: "GET /probe HTTP/1.1\r\nHost: x\r\n\r\n"})
	if len(res.Statuses) != 2 || res.Statuses[0] != 200 || res.Statuses[1] != 200 {
		t.Fatalf("after the bytes, a new connection with two GETs: answers %v, want 200 200", res)
	}
}

// The strict reading of a request (readStrict).

// strictEnd is how a strict reading of a request ended.
type strictEnd int

const (
	// fWhole: a whole request, framed as RFC 9112 defines.
	fWhole strictEnd = iota
	// fIncomplete: the bytes end before the request does.
	fIncomplete
	// fLoose: the bytes are something the RFC lets a server read more
	// than one way, or that the reading does not model.
	fLoose
	// fClose: the framing is faulty; a server may read this request its
	// own way, once, and must then close the connection.
	fClose
	// fReject: the RFC requires a 400 (and the connection closed).
	fReject
	// fLast: (readClient) a request after which the server reads no more,
	// or the end of the bytes.
	fLast
)

func (f strictEnd) String() string {
	return [...]string{"whole", "incomplete", "read no further", "faulty framing", "must be refused", "the end"}[f]
}

// strictReq is a request as read strictly.
type strictReq struct {
	method string
	body   []byte
	// last: the server reads nothing after it on the connection.
	last bool
}

// readResult is the strict reading of the request at the start of some
// bytes.
type readResult struct {
	f   strictEnd
	why string    // when not fWhole
	req strictReq // when fWhole
	n   int       // the bytes the request takes, when fWhole
}

// readStrict reads the request at the start of b. On the client's bytes
// (up false) it takes what RFC 9112 lets a recipient take, one way (see
// FuzzSmuggling). On the gateway's (up true), which it writes
// anew, any departure from the strict form is fReject.
func readStrict(b []byte, up bool) readResult {
	p := 0
	// line returns the next line, without its line end, and reports
	// whether that was CRLF; ok false when the bytes end first.
	line := func() (l []byte, crlf, ok bool) {
		i := bytes.IndexByte(b[p:], '\n')
		if i < 0 {
			return nil, false, false
		}
		l, p = b[p:p+i], p+i+1
		if len(l) > 0 && l[len(l)-1] == '\r' {
			return l[:len(l)-1], true, true
		}
		return l, false, true
	}
	fail := func(f strictEnd, why string) readResult {
		if up {
			f = fReject
		}
		return readResult{f: f, why: why}
	}
	incomplete := readResult{f: fIncomplete, why: "the bytes end first"}

	// The request line: method SP request-target SP HTTP/1.x, after any
	// empty lines (RFC 9112 2.2: a server ignores at least one, or
	// refuses).
	var l []byte
	for {
		var crlf, ok bool
		l, crlf, ok = line()
		switch {
		case !ok:
			return incomplete
		case !crlf && up:
			return fail(fReject, "the request line ends in a bare LF")
		case len(l) == 0 && up:
			return fail(fReject, "an empty line before the request line")
		}
		if len(l) > 0 {
			break
		}
	}
	parts := bytes.Split(l, []byte{' '})
	if len(parts) != 3 {
		return fail(fLoose, "a request line that is not three words")
	}
	method, target, version := string(parts[0]), parts[1], string(parts[2])
	switch {
	case !isToken(method):
		return fail(fLoose, "a method that is not a token")
	case method == "CONNECT" && !up:
		return fail(fLoose, "CONNECT")
	case len(target) == 0 || bytes.ContainsFunc(target, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return fail(fLoose, "a request target with a control character")
	case version != "HTTP/1.1" && (version != "HTTP/1.0" || up):
		return fail(fLoose, "the version "+strconv.Quote(version))
	}
	http11 := version == "HTTP/1.1"

	// The header fields.
	type field struct{ name, value string }
	var fields []field
	first := true
	for {
		l, crlf, ok := line()
		switch {
		case !ok:
			return incomplete
		case !crlf && up:
			return fail(fReject, "a header line ends in a bare LF")
		}
		if len(l) == 0 {
			break
		}
		if bytes.ContainsAny(l, "\r\x00") {
			if up {
				return fail(fReject, "a CR or NUL in a header line")
			}
			l = bytes.Map(func(r rune) rune {
				if r == '\r' || r == 0 {
					return ' '
				}
				return r
			}, l)
		}
		if l[0] == ' ' || l[0] == '\t' {
			switch {
			case up:
				return fail(fReject, "a header line that starts with whitespace")
			case first: // RFC 9112 2.2: consumed without further processing
			default: // obs-fold, RFC 9112 5.2: replaced with SP
				last := &fields[len(fields)-1]
				last.value = trimOWS(last.value + " " + trimOWS(string(l)))
			}
			continue
		}
		first = false
		name, value, ok := strings.Cut(string(l), ":")
		switch {
		case !ok:
			return fail(fLoose, "a header line without a colon")
		case name == "":
			return fail(fLoose, "a header line without a name")
		case strings.HasSuffix(name, " ") || strings.HasSuffix(name, "\t"):
			return fail(fReject, "whitespace before the colon")
		case up && !isToken(name):
			return fail(fReject, fmt.Sprintf("the header name %q is not a token", name))
		}
		// A name that is not a token is a field of no meaning here.
		fields = append(fields, field{strings.ToLower(name), trimOWS(value)})
	}

	// The framing.
	var te, cl []string
	var conn []string
	hosts := 0
	for _, f := range fields {
		switch f.name {
		case "transfer-encoding":
			te = append(te, splitList(f.value)...)
		case "content-length":
			cl = append(cl, strings.Split(f.value, ",")...)
		case "host":
			hosts++
		case "connection":
			conn = append(conn, splitList(f.value)...)
		}
	}
	switch {
	case hosts > 1:
		return fail(fReject, "two Host fields")
	case http11 && hosts == 0:
		return fail(fReject, "no Host field")
	}
	chunked, size := false, 0
	switch {
	case len(te) > 0 && !http11:
		return fail(fClose, "Transfer-Encoding in HTTP/1.0")
	case len(te) > 0 && !strings.EqualFold(te[len(te)-1], "chunked"):
		return fail(fReject, "a final transfer coding other than chunked")
	case len(te) > 0 && len(cl) > 0:
		return fail(fClose, "Transfer-Encoding with Content-Length")
	case len(te) > 1 && up:
		return fail(fReject, "transfer codings before chunked")
	case len(te) > 0:
		// Codings before chunked (which a server may refuse with 501)
		// leave the framing to chunked.
		chunked = true
	case len(cl) > 0:
		v := trimOWS(cl[0])
		for _, e := range cl {
			if e = trimOWS(e); e == "" || strings.Trim(e, "0123456789") != "" {
				return fail(fReject, fmt.Sprintf("the Content-Length %q", e))
			}
			if e != v {
				return fail(fReject, "different Content-Length values")
			}
		}
		if len(cl) > 1 && up {
			return fail(fReject, "a Content-Length value twice")
		}
		// Else one value (RFC 9110 8.6: a recipient may take equal values
		// as one, or refuse).
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n > 1<<40 {
			return fail(fLoose, "a Content-Length over 2^40")
		}
		size = int(n)
	}

	// The body.
	req := strictReq{method: method}
	if !chunked {
		if len(b)-p < size {
			return incomplete
		}
		req.body, p = b[p:p+size], p+size
	} else {
		for {
			l, crlf, ok := line()
			switch {
			case !ok:
				return incomplete
			case !crlf:
				return fail(fClose, "a chunk line ends in a bare LF")
			}
			hex := l[:len(l)-len(bytes.TrimLeft(l, "0123456789abcdefABCDEF"))]
			if len(hex) == 0 || len(hex) > 10 {
				return fail(fClose, fmt.Sprintf("the chunk line %q", l))
			}
			if !isChunkExt(l[len(hex):]) {
				return fail(fClose, fmt.Sprintf("the chunk extension %q", l[len(hex):]))
			}
			n, _ := strconv.ParseInt(string(hex), 16, 64)
			if n == 0 {
				break
			}
			if len(b)-p < int(n) {
				return incomplete
			}
			req.body = append(req.body, b[p:p+int(n)]...)
			p += int(n)
			switch end := b[p:min(p+2, len(b))]; {
			case !bytes.HasPrefix([]byte("\r\n"), end):
				return fail(fClose, "chunk data not followed by CRLF")
			case len(end) < 2:
				return incomplete
			}
			p += 2
		}
		// The trailer section.
		for {
			l, crlf, ok := line()
			switch {
			case !ok:
				return incomplete
			case !crlf:
				return fail(fClose, "a trailer line ends in a bare LF")
			case len(l) == 0:
			case bytes.ContainsAny(l, "\r\x00"):
				return fail(fClose, "a CR or NUL in a trailer line")
			default:
				name, _, ok := bytes.Cut(l, []byte{':'})
				if !ok || !isToken(string(name)) {
					return fail(fClose, fmt.Sprintf("the trailer line %q", l))
				}
				continue
			}
			break
		}
	}
	if req.body == nil {
		req.body = []byte{}
	}
	// An Upgrade asks for another protocol, which only a 101 starts: the
	// instance never answers one, and the connection stays HTTP/1.1.
	if hasToken(conn, "close") || !http11 && !hasToken(conn, "keep-alive") {
		req.last = true
	}
	return readResult{f: fWhole, req: req, n: p}
}

func isTchar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isTchar(s[i]) {
			return false
		}
	}
	return s != ""
}

func trimOWS(s string) string { return strings.Trim(s, " \t") }

// splitList splits a comma-separated list, dropping empty elements.
func splitList(v string) []string {
	var out []string
	for e := range strings.SplitSeq(v, ",") {
		if e = trimOWS(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

func hasToken(list []string, tok string) bool {
	for _, e := range list {
		if strings.EqualFold(e, tok) {
			return true
		}
	}
	return false
}

// isChunkExt reports whether s is a chunk-ext (RFC 9112 7.1.1):
// *( BWS ";" BWS name [ BWS "=" BWS ( token / quoted-string ) ] ).
func isChunkExt(s []byte) bool {
	i := 0
	bws := func() {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
	}
	tok := func() bool {
		j := i
		for i < len(s) && isTchar(s[i]) {
			i++
		}
		return i > j
	}
	for {
		bws()
		if i == len(s) {
			return i == 0 || s[i-1] != ' ' && s[i-1] != '\t'
		}
		if s[i] != ';' {
			return false
		}
		i++
		bws()
		if !tok() {
			return false
		}
		j := i
		bws()
		if i == len(s) || s[i] != '=' {
			i = j
			continue
		}
		i++
		bws()
		if i < len(s) && s[i] == '"' {
			i++
			for i < len(s) && s[i] != '"' {
				c := s[i]
				if c == '\\' {
					i++
					if i == len(s) || s[i] < ' ' && s[i] != '\t' || s[i] == 0x7f {
						return false
					}
				} else if c < ' ' && c != '\t' || c == 0x7f {
					return false
				}
				i++
			}
			if i == len(s) {
				return false
			}
			i++
		} else if !tok() {
			return false
		}
	}
}
