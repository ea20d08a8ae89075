// Package smuggletest is a test kit for HTTP/1.1 request smuggling and
// header injection at a proxy: a table of raw requests (Cases), a backend
// that records every request a proxy forwards to it (Recorder), and Send,
// which writes a case's bytes to a proxy over TCP and reads its answers.
//
// Every case is followed on the same connection by a terminating request
// for /end with Connection: close, and embeds, where framing could be
// misread, a request for /smuggled. A proxy passes a case when its first
// answer has one of the case's statuses and its backend never receives a
// request for /smuggled: either the proxy refused the bytes, or it read them
// as RFC 9112 says and closed the connection where the RFC requires it.
//
// The gateway's tests and bench/smuggle (the same table against nginx) use
// it.
package smuggletest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Case is one raw request and the answers RFC 9112 allows for it.
type Case struct {
	// Name says what the case sends.
	Name string
	// Raw is the bytes of the request (and any smuggled request after it).
	Raw string
	// Want are the statuses the first answer may have: 400 for a refusal,
	// 200 for a request that is well defined (the backend answers 200).
	Want []int
	// Body, when the request is forwarded, is the body the backend must
	// receive.
	Body string
	// RFC is the rule that decides the case.
	RFC string
}

// Refused reports whether the case must be refused.
func (c Case) Refused() bool {
	for _, s := range c.Want {
		if s < 300 {
			return false
		}
	}
	return true
}

const smuggled = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"

// Cases is the table.
var Cases = []Case{
	{Name: "control: content-length", Raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", Want: []int{200}, Body: "hello", RFC: "9112 6.2"},
	{Name: "control: chunked", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", Want: []int{200}, Body: "hello", RFC: "9112 7.1"},
	{Name: "control: chunk extension", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;name=value\r\nhello\r\n0\r\n\r\n", Want: []int{200}, Body: "hello", RFC: "9112 7.1.1"},

	// Content-Length with Transfer-Encoding: refuse, or read it chunked and
	// close the connection after answering (the smuggled request must not
	// reach the backend).
	{Name: "CL.TE: content-length then chunked", Raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, Want: []int{400, 200}, RFC: "9112 6.1, 6.3 (3)"},
	{Name: "TE.CL: chunked then content-length", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n" + fmt.Sprintf("%x", len(smuggled)) + "\r\n" + smuggled + "\r\n0\r\n\r\n", Want: []int{400, 200}, Body: smuggled, RFC: "9112 6.1, 6.3 (3)"},
	{Name: "TE in HTTP/1.0", Raw: "POST / HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 6\r\n\r\n0\r\n\r\n" + smuggled, Want: []int{400, 200}, RFC: "9112 6.1"},

	// Content-Length.
	{Name: "two different content-lengths", Raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 41\r\n\r\nhello" + smuggled, Want: []int{400}, RFC: "9112 6.3 (5)"},
	{Name: "content-length list of different values", Raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 41\r\n\r\nhello" + smuggled, Want: []int{400}, RFC: "9112 6.3 (5)"},
	{Name: "two equal content-lengths", Raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", Want: []int{400, 200}, Body: "hello", RFC: "9110 8.6"},
	{Name: "content-length with a sign", Raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello" + smuggled, Want: []int{400}, RFC: "9110 8.6"},
	{Name: "negative content-length", Raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n" + smuggled, Want: []int{400}, RFC: "9110 8.6"},
	{Name: "hexadecimal content-length", Raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0x5\r\n\r\nhello" + smuggled, Want: []int{400}, RFC: "9110 8.6"},
	{Name: "content-length overflowing 64 bits", Raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 18446744073709551621\r\n\r\nhello" + smuggled, Want: []int{400}, RFC: "9112 6.3 (5)"},
	{Name: "space before the colon", Raw: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length : 5\r\n\r\nhello" + smuggled, Want: []int{400}, RFC: "9112 5.1"},

	// Transfer-Encoding variants.
	{Name: "chunked, identity", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n" + smuggled, Want: []int{400, 501}, RFC: "9112 6.1, 6.3 (4)"},
	{Name: "identity, chunked", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity, chunked\r\n\r\n0\r\n\r\n" + smuggled, Want: []int{400, 501}, RFC: "9112 6.1"},
	{Name: "transfer-encoding identity", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n" + smuggled, Want: []int{400, 501}, RFC: "9112 6.3 (4)"},
	{Name: "transfer-encoding identity with content-length", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\nContent-Length: 6\r\n\r\n0\r\n\r\n" + smuggled, Want: []int{400, 501}, RFC: "9112 6.1, 6.3 (4)"},
	{Name: "two transfer-encoding fields", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n" + smuggled, Want: []int{400, 501}, RFC: "9112 6.1"},
	{Name: "transfer-encoding gzip last", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nContent-Length: 6\r\n\r\n0\r\n\r\n" + smuggled, Want: []int{400, 501}, RFC: "9112 6.3 (4)"},
	{Name: "transfer-encoding CHUNKED", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: CHUNKED\r\n\r\n5\r\nhello\r\n0\r\n\r\n", Want: []int{200, 501, 400}, Body: "hello", RFC: "9112 7 (case-insensitive)"},
	{Name: "transfer-encoding xchunked", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\nContent-Length: 6\r\n\r\n0\r\n\r\n" + smuggled, Want: []int{400, 501}, RFC: "9112 6.1"},
	{Name: "transfer-encoding with a tab", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\tchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", Want: []int{200, 400, 501}, Body: "hello", RFC: "9112 5.1 (OWS)"},
	{Name: "space in the transfer-encoding name", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\nContent-Length: 6\r\n\r\n0\r\n\r\n" + smuggled, Want: []int{400}, RFC: "9112 5.1"},
	{Name: "transfer-encoding on a folded line", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\nContent-Length: 6\r\n\r\n0\r\n\r\n" + smuggled, Want: []int{400, 200}, RFC: "9112 5.2, 6.1"},

	// obs-fold, CR, LF, NUL.
	{Name: "obs-fold", Raw: "GET / HTTP/1.1\r\nHost: x\r\nX-A: one\r\n two\r\n\r\n", Want: []int{400, 200}, RFC: "9112 5.2 (400, or fold to SP)"},
	{Name: "bare LF line ends", Raw: "GET / HTTP/1.1\nHost: x\nX-A: one\n\n", Want: []int{200, 400}, RFC: "9112 2.2 (MAY accept LF)"},
	{Name: "bare CR in a value", Raw: "GET / HTTP/1.1\r\nHost: x\r\nX-A: one\rTwo: three\r\n\r\n", Want: []int{400}, RFC: "9112 2.2"},
	{Name: "bare CR ends the head", Raw: "GET / HTTP/1.1\r\nHost: x\r\r\n\r\n", Want: []int{400}, RFC: "9112 2.2"},
	{Name: "NUL in a value", Raw: "GET / HTTP/1.1\r\nHost: x\r\nX-A: one\x00two\r\n\r\n", Want: []int{400}, RFC: "9110 5.5"},
	{Name: "NUL in a name", Raw: "GET / HTTP/1.1\r\nHost: x\r\nX-\x00A: one\r\n\r\n", Want: []int{400}, RFC: "9110 5.1"},
	{Name: "NUL in the target", Raw: "GET /a\x00b HTTP/1.1\r\nHost: x\r\n\r\n", Want: []int{400}, RFC: "9112 3.2"},
	{Name: "header line without a colon", Raw: "GET / HTTP/1.1\r\nHost: x\r\nX-A one\r\n\r\n", Want: []int{400}, RFC: "9112 5"},
	{Name: "two hosts", Raw: "GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", Want: []int{400}, RFC: "9112 3.2"},
	{Name: "no host", Raw: "GET / HTTP/1.1\r\n\r\n", Want: []int{400}, RFC: "9112 3.2"},

	// Chunks.
	{Name: "chunk size not hexadecimal", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", Want: []int{400}, RFC: "9112 7.1"},
	{Name: "negative chunk size", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n", Want: []int{400}, RFC: "9112 7.1"},
	{Name: "chunk size 0x prefix", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n", Want: []int{400}, RFC: "9112 7.1"},
	{Name: "chunk size overflowing 64 bits", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000005\r\nhello\r\n0\r\n\r\n", Want: []int{400}, RFC: "9112 7.1"},
	{Name: "chunk shorter than its size", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n", Want: []int{400}, RFC: "9112 7.1"},
	{Name: "chunk size with a space", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n", Want: []int{400, 200}, Body: "hello", RFC: "9112 7.1.1 (BWS before ;)"},
	{Name: "chunk extension with a bare LF", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\nhello\r\n0\r\n\r\n", Want: []int{400}, RFC: "9112 7.1.1"},
	{Name: "chunk extension with a bare CR", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;a=\rb\r\nhello\r\n0\r\n\r\n", Want: []int{400}, RFC: "9112 7.1.1"},
	{Name: "chunk data without CRLF", Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n", Want: []int{400}, RFC: "9112 7.1"},

	// Size.
	{Name: "oversized header (2 MiB)", Raw: "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 2<<20) + "\r\n\r\n", Want: []int{400, 431}, RFC: "6585 5"},
}

// Received is one request that reached a Recorder.
type Received struct {
	Method, Path string
	Header       http.Header
	Body         string
	// BodyErr is the error reading the body ended with, if not EOF.
	BodyErr error
}

// Recorder is a loopback HTTP/1.1 backend that records what it receives:
// the requests (Requests) and the raw bytes (Raw). It answers 200 "ok".
type Recorder struct {
	Addr string

	srv  *http.Server
	done chan struct{}
	mu   sync.Mutex
	reqs []Received
	raw  bytes.Buffer
}

// NewRecorder starts a Recorder on a free loopback port.
func NewRecorder() (*Recorder, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Recorder{Addr: ln.Addr().String(), done: make(chan struct{})}
	// OPTIONS * reaches the handler too, to be recorded (and its body read).
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second, DisableGeneralOptionsHandler: true}
	go func() {
		defer close(r.done)
		r.srv.Serve(teeListener{Listener: ln, r: r})
	}()
	return r, nil
}

// Close stops the Recorder and waits for it.
func (r *Recorder) Close() error {
	err := r.srv.Close()
	<-r.done
	return err
}

func (r *Recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	r.mu.Lock()
	r.reqs = append(r.reqs, Received{Method: req.Method, Path: req.URL.Path, Header: req.Header.Clone(), Body: string(body), BodyErr: err})
	r.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain")
	io.WriteString(w, "ok")
}

// Requests returns the requests received so far.
func (r *Recorder) Requests() []Received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Received(nil), r.reqs...)
}

// Raw returns the bytes received so far, on every connection.
func (r *Recorder) Raw() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.raw.Bytes())
}

// Reset forgets what was received.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = nil
	r.raw.Reset()
}

type teeListener struct {
	net.Listener
	r *Recorder
}

func (l teeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return teeConn{Conn: c, r: l.r}, nil
}

type teeConn struct {
	net.Conn
	r *Recorder
}

func (c teeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.r.mu.Lock()
		c.r.raw.Write(p[:n])
		c.r.mu.Unlock()
	}
	return n, err
}

// Result is what a proxy answered to a case.
type Result struct {
	// Status is the first answer's status, 0 when there was none.
	Status int
	// Header is the first answer's header, nil when there was none.
	Header http.Header
	// Statuses are every answer's status, in order.
	Statuses []int
	// Err is why reading the answers stopped, if not at the end of the
	// connection.
	Err error
}

func (r Result) String() string {
	if r.Status == 0 {
		if r.Err != nil {
			return "no answer: " + r.Err.Error()
		}
		return "closed"
	}
	s := fmt.Sprint(r.Statuses)
	if r.Err != nil {
		s += " (" + r.Err.Error() + ")"
	}
	return s
}

// End is the request that follows every case: it asks the proxy to close
// the connection, so that Send reads to its end.
const End = "GET /end HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"

// Send writes c's bytes and End to a proxy at addr and reads every answer
// until the proxy closes the connection, or ctx ends.
func Send(ctx context.Context, addr string, c Case) Result {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return Result{Err: err}
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	// The proxy may answer and close before it has read everything: write
	// concurrently, and ignore the write's error.
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		io.WriteString(conn, c.Raw+End)
	}()
	defer func() { <-wrote }()
	var res Result
	br := bufio.NewReader(conn)
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			if !errors.Is(err, io.EOF) && !isReset(err) {
				res.Err = err
			}
			break
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		res.Statuses = append(res.Statuses, resp.StatusCode)
		if res.Status == 0 {
			res.Status, res.Header = resp.StatusCode, resp.Header
		}
		if resp.Close {
			break
		}
	}
	conn.Close() // unblocks the writer
	return res
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && strings.Contains(op.Err.Error(), "reset")
}

// Check reports what is wrong with a proxy's answer res to c, given the
// requests its backend received: nil when the case passed.
func Check(c Case, res Result, got []Received) error {
	ok := false
	for _, s := range c.Want {
		ok = ok || res.Status == s
	}
	if !ok {
		return fmt.Errorf("answered %v, want one of %v", res, c.Want)
	}
	for _, r := range got {
		if r.Path == "/smuggled" {
			return fmt.Errorf("the backend received the smuggled request (answers %v)", res)
		}
	}
	var first *Received
	for i := range got {
		if got[i].Path != "/end" && got[i].BodyErr == nil {
			if first != nil {
				return fmt.Errorf("the backend received %d requests for one", 2)
			}
			first = &got[i]
		}
	}
	if res.Status >= 300 {
		if first != nil && first.BodyErr == nil {
			return fmt.Errorf("refused with %d, but the backend received the whole request %s %s", res.Status, first.Method, first.Path)
		}
		return nil
	}
	if first == nil {
		return errors.New("answered 200, but the backend received nothing")
	}
	if c.Body != "" && first.Body != c.Body {
		return fmt.Errorf("the backend received the body %q, want %q", first.Body, c.Body)
	}
	return nil
}
