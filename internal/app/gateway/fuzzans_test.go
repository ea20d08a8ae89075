package gateway

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/app/gateway/upstream"
	"github.com/valyala/fasthttp"
)

// FuzzAnswer sends an instance's answer, of any bytes, through the gateway
// and checks that it stays the answer of the request it was sent for: the
// upstream connection that carried it is either read to a clean end or not
// used again, so that no byte of it is read as the answer of a later
// request (another client's, maybe another lane's), and the client gets it
// as one answer or as none, never as two.
//
// The instance (answerInstance) answers the request for /fuzz with the
// fuzzed bytes, verbatim, in one write (and then, with close, closes the
// connection), and every other request, on any connection, with a
// well-formed answer that carries the request's own id (/m/<id>) in a
// header and as its body. Each exec sends:
//
//  1. GET (or, with head, HEAD) /fuzz from a client connection A: any
//     answer, a gateway error, or a cut, will do; but an answer that the
//     client reads whole and that is not the gateway's must be whole in the
//     instance's bytes too (net/http's parse of them, where it reads the
//     same status, does not find the body cut short); and when A stays
//     open, a second request on it gets its own answer (or an error, or a
//     closed connection): the rest of the first answer does not come as the
//     answer of the second;
//     1b. the same for GET (or HEAD) /fuzz from an HTTP/1.0 client, which
//     gets no Transfer-Encoding, and whose whole answer must be whole in the
//     instance's bytes too;
//  2. two requests, from a client connection B, each with an id of its own
//     that nothing knew before: each gets the instance's answer carrying
//     that id, whole, or the gateway's error (x-lanes-error); nothing else
//     (a byte of the fuzzed answer, or another request's answer, would be a
//     leak from one request to another);
//  3. and then the gateway still serves: a request gets its answer.
//
// Before the next exec, every upstream connection is closed (each exec
// starts on new ones). The timeouts are short (fuzzAnswerTimeout), since
// many fuzzed answers stall: a cut short of its length, or a body of no
// length on a connection that stays open.
func FuzzAnswer(f *testing.F) {
	for _, s := range fuzzAnswerSeeds() {
		f.Add(s.head, s.close, []byte(s.answer))
	}
	var worlds [len(stacks)]*fuzzAnswerWorld
	for i, s := range stacks {
		worlds[i] = newFuzzAnswerWorld(f, s)
	}
	f.Fuzz(func(t *testing.T, head, closeAfter bool, answer []byte) {
		if len(answer) > 64<<10 {
			t.Skip("longer than the bound of the fuzzed answers")
		}
		if bytes.Contains(bytes.ToLower(answer), []byte("lanes-error")) {
			// Would let a leaked answer pass for the gateway's error.
			t.Skip("the answer names the gateway's error header")
		}
		for i, s := range stacks {
			t.Run("http1="+s, func(t *testing.T) { worlds[i].exec(t, head, closeAfter, answer) })
		}
	})
}

// fuzzAnswerTimeout is the response-header and upstream read timeouts of
// FuzzAnswer's gateway. An answer of the instance's that it misses, on a
// busy machine, is the gateway's 504 or 502, which the property allows.
const fuzzAnswerTimeout = 25 * time.Millisecond

type fuzzAnswerSeed struct {
	head, close bool
	answer      string
}

// leak is a whole answer hidden after the first: it must never reach a
// client.
const leak = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nX-Marker: leak\r\n\r\nleak"

func fuzzAnswerSeeds() []fuzzAnswerSeed {
	ok := "HTTP/1.1 200 OK\r\n"
	return []fuzzAnswerSeed{
		{false, false, ok + "Content-Length: 2\r\n\r\nok"},
		// Content-Length and Transfer-Encoding, either order.
		{false, false, ok + "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + leak},
		{false, false, ok + "Transfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + leak},
		// Two lengths, that differ or not.
		{false, false, ok + "Content-Length: 2\r\nContent-Length: 5\r\n\r\nhello" + leak},
		{false, false, ok + "Content-Length: 2\r\nContent-Length: 2\r\n\r\nok" + leak},
		{false, false, ok + "Content-Length: 2, 5\r\n\r\nhello" + leak},
		{false, false, ok + "Content-Length: +2\r\n\r\nok" + leak},
		// A body longer than its length: the rest is another answer.
		{false, false, ok + "Content-Length: 2\r\n\r\nok" + leak},
		{false, false, ok + "Content-Length: 0\r\n\r\n" + leak},
		// A body shorter than its length, and the connection open or closed.
		{false, false, ok + "Content-Length: 10\r\n\r\nshort"},
		{false, true, ok + "Content-Length: 10\r\n\r\nshort"},
		{false, true, ok + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"},
		// Bad chunk sizes, and a chunked body with bytes after its end.
		{false, false, ok + "Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n" + leak},
		{false, false, ok + "Transfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n" + leak},
		{false, false, ok + "Transfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\nhello\r\n0\r\n\r\n"},
		{false, false, ok + "Transfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\n" + leak},
		{false, false, ok + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + leak},
		{false, false, ok + "Transfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n" + leak},
		{false, false, ok + "Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + leak},
		{false, false, ok + "Transfer-Encoding: chunked, identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + leak},
		// 1xx answers before the final one; a bodiless one with a body.
		{false, false, "HTTP/1.1 100 Continue\r\n\r\n" + ok + "Content-Length: 2\r\n\r\nok"},
		{false, false, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\n" + ok + "Content-Length: 2\r\n\r\nok" + leak},
		{false, false, "HTTP/1.1 100 Continue\r\nContent-Length: 4\r\n\r\nleak" + ok + "Content-Length: 2\r\n\r\nok"},
		{false, false, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n" + leak},
		// Bodiless answers with a body: 204, 304, and any answer to HEAD.
		{false, false, "HTTP/1.1 204 No Content\r\nContent-Length: 4\r\n\r\nleak" + leak},
		{false, false, "HTTP/1.1 204 No Content\r\n\r\n" + leak},
		{false, false, "HTTP/1.1 304 Not Modified\r\nContent-Length: 4\r\n\r\nleak" + leak},
		{true, false, ok + "Content-Length: 4\r\n\r\nleak" + leak},
		{true, false, ok + "Transfer-Encoding: chunked\r\n\r\n" + leak},
		{true, false, ok + "\r\n" + leak},
		// Line ends and bytes that parsers disagree on.
		{false, false, "HTTP/1.1 200 OK\nContent-Length: 2\n\nok" + leak},
		{false, false, ok + "X-A: a\r\n b\r\nContent-Length: 2\r\n\r\nok" + leak},
		{false, false, ok + "X-A: a\r\n Content-Length: 40\r\nContent-Length: 2\r\n\r\nok" + leak},
		{false, false, ok + "X-A: a\rContent-Length: 40\r\nContent-Length: 2\r\n\r\nok" + leak},
		{false, false, ok + "X-A: a\x00b\r\nContent-Length: 2\r\n\r\nok" + leak},
		{false, false, ok + "Content-Length : 2\r\n\r\nok" + leak},
		{false, false, ok + "X-A: a\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + leak},
		// No length: the body ends when the connection does.
		{false, false, ok + "\r\nuntil the end"},
		{false, true, ok + "\r\nuntil the end"},
		{false, false, "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok" + leak},
		{false, false, "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok" + leak},
		{false, false, ok + "Connection: close\r\nContent-Length: 2\r\n\r\nok" + leak},
		// A head over the gateway's bound, and one that never ends.
		{false, false, ok + "X-Big: " + strings.Repeat("b", upstream.MaxResponseHead) + "\r\nContent-Length: 2\r\n\r\nok" + leak},
		{false, false, ok + "Content-Length: 2\r\n"},
		{false, true, ok + "Content-Length: 2\r\n"},
		{false, false, "garbage\r\n\r\n" + leak},
		{false, true, ""},
	}
}

// fuzzAnswerWorld is FuzzAnswer's gateway and instance, for all its execs.
type fuzzAnswerWorld struct {
	w      *world
	inst   *answerInstance
	prefix string // of the ids, unknown to the fuzzed answers
	n      atomic.Int64
}

func newFuzzAnswerWorld(tb testing.TB, stack string) *fuzzAnswerWorld {
	// No instance is ejected for its errors: the fuzzed answers fail often.
	w := newWorld(tb, "outlier: {errors: 1000, window: 1ms, ejection: 1ms}\n", Config{
		ResponseHeaderTimeout: fuzzAnswerTimeout, UpstreamReadTimeout: fuzzAnswerTimeout,
		Logger: slog.New(slog.DiscardHandler), HTTP1: stack})
	inst := newAnswerInstance(tb)
	w.register(tb, "orders", "fuzzed", inst.addr, "")
	var b [6]byte
	rand.Read(b[:])
	return &fuzzAnswerWorld{w: w, inst: inst, prefix: hex.EncodeToString(b[:])}
}

func (fw *fuzzAnswerWorld) id() string {
	return fmt.Sprintf("%s-%d", fw.prefix, fw.n.Add(1))
}

func (fw *fuzzAnswerWorld) exec(t *testing.T, head, closeAfter bool, answer []byte) {
	fw.inst.set(answer, closeAfter)
	defer fw.quiesce(t)

	method := http.MethodGet
	if head {
		method = http.MethodHead
	}
	// 1: the fuzzed answer, and a second request on the same connection.
	a := dialRaw(t, fw.w.addr)
	res, body, err := a.exchange(method, "/fuzz", "")
	if err == nil && !gatewayError(res) {
		if why := wholeInBytes(answer, head, closeAfter, res, body); why != "" {
			t.Fatalf("the client read a whole %d answer of %d bytes (Content-Length %d, Transfer-Encoding %q) that the instance cut: %s",
				res.StatusCode, len(body), res.ContentLength, res.TransferEncoding, why)
		}
	}
	if stackOf(t) == HTTP1Std {
		// net/http's transport can hand the next request an idle
		// connection before its read loop has seen the bytes the instance
		// sent past the answer, and the request reads them as its answer
		// (docs/security.md, Answers from instances): a race of net/http's
		// that the std path cannot close. The checks below start on new
		// upstream connections there; the fast path, which looks at a
		// connection before it reuses one, keeps its own.
		fw.quiesce(t)
	}
	if err == nil && !res.Close {
		id := fw.id()
		res, body, err := a.exchange(http.MethodGet, "/m/"+id, id)
		if why := notOwn(res, body, err, id, true); why != "" {
			t.Fatalf("on the connection of the fuzzed answer, the next request's answer: %s", why)
		}
	}
	a.close()

	// 1b: the fuzzed answer again, to an HTTP/1.0 client (on new upstream
	// connections), which has no chunked coding and reads an answer of no
	// length to the end of the connection: it gets no Transfer-Encoding,
	// and an answer that the instance cut does not end as a whole one does.
	fw.quiesce(t)
	a10 := dialRaw(t, fw.w.addr)
	a10.proto = "HTTP/1.0"
	if res, body, err := a10.exchange(method, "/fuzz", ""); err == nil && !gatewayError(res) {
		if len(res.TransferEncoding) > 0 {
			t.Fatalf("Transfer-Encoding %q to an HTTP/1.0 client", res.TransferEncoding)
		}
		if why := wholeInBytes(answer, head, closeAfter, res, body); why != "" {
			t.Fatalf("the HTTP/1.0 client read a whole %d answer of %d bytes (Content-Length %d) that the instance cut: %s",
				res.StatusCode, len(body), res.ContentLength, why)
		}
	}
	a10.close()
	if stackOf(t) == HTTP1Std {
		fw.quiesce(t) // net/http's race, as after 1
	}

	// 2: requests from another connection get their own answers.
	var b *rawClient
	for range 2 {
		if b == nil {
			b = dialRaw(t, fw.w.addr)
		}
		id := fw.id()
		res, body, err := b.exchange(http.MethodGet, "/m/"+id, id)
		if why := notOwn(res, body, err, id, false); why != "" {
			t.Fatalf("a later request's answer, from another connection: %s", why)
		}
		if res.Close {
			b.close()
			b = nil
		}
	}
	if b != nil {
		b.close()
	}

	// 3: the gateway still serves.
	deadline := time.Now().Add(waitFor)
	for {
		c := dialRaw(t, fw.w.addr)
		id := fw.id()
		res, body, err := c.exchange(http.MethodGet, "/m/"+id, id)
		c.close()
		if why := notOwn(res, body, err, id, false); why != "" {
			t.Fatalf("a request after the fuzzed answer: %s", why)
		}
		if !gatewayError(res) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway answers nothing but errors (last %d %s) for %s after the fuzzed answer", res.StatusCode, res.Header.Get(hError), waitFor)
		}
	}
}

// quiesce closes the gateway's upstream connections and waits until every
// connection of the instance is gone and the fast path has none in use:
// the next exec starts on new ones.
func (fw *fuzzAnswerWorld) quiesce(t *testing.T) {
	deadline := time.Now().Add(waitFor)
	for {
		fw.closeIdle()
		if fw.inst.live.Load() == 0 && fw.busy() == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections to the instance still open %s after the exec (%d in use on the fast path)", fw.inst.live.Load(), waitFor, fw.busy())
		}
		select {
		case <-fw.inst.gone:
		case <-time.After(2 * time.Millisecond): // a connection back in a pool after closeIdle
		}
	}
}

func (fw *fuzzAnswerWorld) closeIdle() {
	g := fw.w.gw
	if f := fastOf(g); f != nil {
		f.up.CloseIdleConnections()
	}
	if tr, ok := g.std.h1.(*http.Transport); ok {
		tr.CloseIdleConnections()
	}
}

// busy is the number of the fast path's upstream connections in use.
func (fw *fuzzAnswerWorld) busy() int {
	f := fastOf(fw.w.gw)
	if f == nil {
		return 0
	}
	return f.up.InUse(fw.inst.addr)
}

// gatewayError reports whether res is the gateway's own error.
func gatewayError(res *http.Response) bool {
	return res != nil && res.Header.Get(hError) != ""
}

// notOwn returns what is wrong with the answer to the request carrying id,
// or "": the instance's answer for id, whole, or the gateway's error; with
// mayClose, also no answer at all, the connection closed (or reset) before
// any byte of one (a server may close a connection it kept open).
func notOwn(res *http.Response, body []byte, err error, id string, mayClose bool) string {
	switch {
	case err != nil && res == nil:
		if mayClose && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
			return ""
		}
		return fmt.Sprintf("no answer: %v", err)
	case err != nil:
		return fmt.Sprintf("%d %q with a body of %d bytes (%q) cut: %v", res.StatusCode, res.Header, len(body), clip(body), err)
	case gatewayError(res):
		return ""
	case res.StatusCode == http.StatusOK && len(res.Header.Values("X-Marker")) == 1 && res.Header.Get("X-Marker") == id && string(body) == id:
		return ""
	}
	return fmt.Sprintf("%d %q %q, not the answer for %s", res.StatusCode, res.Header, clip(body), id)
}

func clip(b []byte) []byte {
	if len(b) > 200 {
		return b[:200]
	}
	return b
}

// wholeInBytes returns why the answer that the client read whole, res with
// body, was not whole in the instance's bytes, or "": where net/http reads
// the answer's head with the same final status, and then a body that ends
// short (cut by the connection's close, or, when it stays open, by the
// bytes' end), the client must not have got that cut body as a whole one,
// unless fasthttp's parser, which the fast path reads answers with, reads
// the bytes as a whole answer of that status. A head that net/http reads
// otherwise, or not at all, or framed otherwise (a body the client got of
// other bytes), is a matter between parsers, not a cut: each path's parser
// frames the answer (fasthttp, for one, reads "Content-Length :2" as the
// length, as RFC 9112 5.1 asks a proxy to, where net/http reads no length).
func wholeInBytes(answer []byte, head, closeAfter bool, res *http.Response, body []byte) string {
	var end error = errStalled
	if closeAfter {
		end = io.EOF
	}
	bytesThenEnd := func() *bufio.Reader {
		return bufio.NewReader(io.MultiReader(bytes.NewReader(answer), errReader{end}))
	}
	fr := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(fr)
	fr.SkipBody = head
	if fr.Read(bytesThenEnd()) == nil && fr.StatusCode() == res.StatusCode {
		return ""
	}
	br := bytesThenEnd()
	method := http.MethodGet
	if head {
		method = http.MethodHead
	}
	req := &http.Request{Method: method}
	for {
		ref, err := http.ReadResponse(br, req)
		if err != nil {
			return ""
		}
		if ref.StatusCode >= 200 || ref.StatusCode == http.StatusSwitchingProtocols {
			if ref.StatusCode != res.StatusCode {
				return ""
			}
			cut, err := io.ReadAll(ref.Body)
			if err != nil && bytes.Equal(cut, body) {
				return fmt.Sprintf("net/http reads the instance's %d with its body cut after these %d bytes: %v", ref.StatusCode, len(cut), err)
			}
			return ""
		}
	}
}

// errStalled is the end of the instance's bytes on a connection that stays
// open: nothing more comes.
var errStalled = errors.New("the instance sends nothing more")

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// rawClient is a client connection to the gateway, read with net/http's
// response parser.
type rawClient struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
	// proto is the protocol of its requests: "HTTP/1.1", or as set.
	proto string
}

func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, waitFor)
	if err != nil {
		t.Fatal(err)
	}
	return &rawClient{t: t, c: c, br: bufio.NewReader(c), proto: "HTTP/1.1"}
}

func (r *rawClient) close() { r.c.Close() }

// exchange sends a request (with id, an X-Fuzz-Id header) and reads its
// answer, past the 1xx ones, and the answer's body; err is a failure to
// read either. The answer is read within waitFor: the gateway ends or cuts
// any answer within its timeouts.
func (r *rawClient) exchange(method, target, id string) (*http.Response, []byte, error) {
	r.t.Helper()
	r.c.SetDeadline(time.Now().Add(waitFor))
	raw := method + " " + target + " " + r.proto + "\r\nHost: fuzz\r\n"
	if id != "" {
		raw += "X-Fuzz-Id: " + id + "\r\n"
	}
	if _, err := io.WriteString(r.c, raw+"\r\n"); err != nil {
		return nil, nil, err
	}
	req := &http.Request{Method: method}
	for {
		res, err := http.ReadResponse(r.br, req)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				r.t.Fatalf("%s %s: no answer within %s", method, target, waitFor)
			}
			return nil, nil, err
		}
		if res.StatusCode >= 200 || res.StatusCode == http.StatusSwitchingProtocols {
			body, err := io.ReadAll(res.Body)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				r.t.Fatalf("%s %s: the body of the %d answer did not end within %s", method, target, res.StatusCode, waitFor)
			}
			return res, body, err
		}
	}
}

// answerInstance is FuzzAnswer's instance: it answers a request for /fuzz
// with the answer set (set) in one write, and then, with close, closes the
// connection; and a request for /m/<id> with an answer that carries the
// id, on any connection, for as long as the connection lasts.
type answerInstance struct {
	addr string
	mu   sync.Mutex
	ans  []byte
	shut bool          // close after the answer
	live atomic.Int32  // connections open
	gone chan struct{} // a connection ended
}

func newAnswerInstance(tb testing.TB) *answerInstance {
	a := &answerInstance{gone: make(chan struct{}, 1)}
	a.addr = serveBackendConns(tb, func(c net.Conn, _ bool) {
		a.live.Add(1)
		defer func() {
			a.live.Add(-1)
			select {
			case a.gone <- struct{}{}:
			default:
			}
		}()
		a.serve(c)
	})
	return a
}

func (a *answerInstance) set(answer []byte, closeAfter bool) {
	a.mu.Lock()
	a.ans, a.shut = answer, closeAfter
	a.mu.Unlock()
}

func (a *answerInstance) serve(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		// Longer than quiesce waits for a connection the gateway should
		// have closed.
		c.SetDeadline(time.Now().Add(2 * waitFor))
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		if req.URL.Path == "/fuzz" {
			a.mu.Lock()
			ans, shut := a.ans, a.shut
			a.mu.Unlock()
			if _, err := c.Write(ans); err != nil || shut {
				return
			}
			continue
		}
		id, ok := strings.CutPrefix(req.URL.Path, "/m/")
		if !ok || id != req.Header.Get("X-Fuzz-Id") {
			return
		}
		if _, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Marker: %s\r\n\r\n%s", len(id), id, id); err != nil {
			return
		}
	}
}

// TestUnsolicitedAnswer: an instance that answers a request, and then, once
// that answer has reached the client, sends a second answer on the idle
// connection (an instance that answers twice, or late), has that second
// answer read as no request's: the next request gets its own answer, on
// either stack. The fast stack looks at an idle connection before it sends a
// request on it (idleCheck); net/http's transport reads its idle
// connections and closes one on which bytes come, with a race that the
// gateway cannot close (a request sent before its read loop has seen the
// bytes would read them), so on the net/http path the next request waits
// until the connection is closed.
func TestUnsolicitedAnswer(t *testing.T) { onStacks(t, testUnsolicitedAnswer) }

func testUnsolicitedAnswer(t *testing.T) {
	late, wrote := make(chan struct{}), make(chan struct{})
	var closed atomic.Bool
	shut := make(chan struct{})
	addr := serveBackendConns(t, func(c net.Conn, first bool) {
		br := bufio.NewReader(c)
		for {
			c.SetDeadline(time.Now().Add(waitFor))
			req, err := http.ReadRequest(br)
			if err != nil {
				if first && errors.Is(err, io.EOF) && closed.CompareAndSwap(false, true) {
					close(shut)
				}
				return
			}
			if req.URL.Path == "/first" {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				<-late
				io.WriteString(c, leak)
				close(wrote)
				continue
			}
			id := req.Header.Get("X-Fuzz-Id")
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Marker: %s\r\n\r\n%s", len(id), id, id)
		}
	})
	w := newWorld(t, "", Config{})
	w.register(t, "orders", "twice", addr, "")
	a := dialRaw(t, w.addr)
	defer a.close()
	if res, body, err := a.exchange(http.MethodGet, "/first", ""); err != nil || string(body) != "ok" {
		t.Fatalf("the first answer: %v %q, err %v", res, body, err)
	}
	close(late)
	<-wrote
	if stackOf(t) == HTTP1Std {
		select {
		case <-shut:
		case <-time.After(waitFor):
			t.Fatalf("net/http's transport kept the connection on which unsolicited bytes came for %s", waitFor)
		}
	}
	for i := range 3 {
		id := fmt.Sprint("own-", i)
		res, body, err := a.exchange(http.MethodGet, "/m/"+id, id)
		if why := notOwn(res, body, err, id, false); why != "" || gatewayError(res) {
			t.Fatalf("the next request's answer: %s %v", why, res.Header)
		}
	}
}

// serveBackendConns serves each connection to a loopback port on a
// goroutine of its own with handle (first: the first connection), until
// the test ends, and returns the address.
func serveBackendConns(tb testing.TB, handle func(c net.Conn, first bool)) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		conns  = map[net.Conn]struct{}{}
		closed bool
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for first := true; ; first = false {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed {
				mu.Unlock()
				c.Close()
				return
			}
			conns[c] = struct{}{}
			wg.Add(1)
			mu.Unlock()
			go func() {
				defer wg.Done()
				handle(c, first)
				c.Close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
		}
	}()
	tb.Cleanup(func() {
		l.Close()
		mu.Lock()
		closed = true
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
}
