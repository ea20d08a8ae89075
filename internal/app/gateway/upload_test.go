package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lanesdev/lanes/routing"
)

// The request bodies of these tests: uploadHead is sent first, and the
// client holds the rest back until the instance has read uploadSeen of it.
// Both are well above the fast path's bufferedRequestBody.
const (
	uploadHead = 256 << 10
	uploadSeen = 64 << 10
	uploadRest = 256 << 10
)

// TestUploadStreams: a large request body, of known length or chunked,
// reaches the instance while the client still holds the rest of it back,
// and then arrives whole, with the trailers of a chunked one; so does the
// body of a request with a TE header, which the fast path hands to the
// net/http handler (adapt) and which no size bounds either.
func TestUploadStreams(t *testing.T) { onStacks(t, testUploadStreams) }

func testUploadStreams(t *testing.T) {
	w := newWorld(t, "", Config{})
	seen := make(chan struct{}, 1)
	addr := serveBackend(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if _, err := io.CopyN(io.Discard, r.Body, uploadSeen); err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		seen <- struct{}{}
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(rw, "%d %q %q", uploadSeen+n, r.Header.Get("Content-Length"), r.Trailer.Get("X-Sum"))
	}))
	w.register(t, "orders", "up", addr, "")
	total := uploadHead + uploadRest
	for _, c := range []struct {
		name    string
		length  int64
		trailer bool
		te      bool
		want    string
	}{
		{"content-length", int64(total), false, false, fmt.Sprintf("%d %q %q", total, fmt.Sprint(total), "")},
		{"chunked", -1, false, false, fmt.Sprintf("%d %q %q", total, "", "")},
		{"chunked with trailers", -1, true, false, fmt.Sprintf("%d %q %q", total, "", "42")},
		{"te/content-length", int64(total), false, true, fmt.Sprintf("%d %q %q", total, fmt.Sprint(total), "")},
		{"te/chunked with trailers", -1, true, true, fmt.Sprintf("%d %q %q", total, "", "42")},
	} {
		t.Run(c.name, func(t *testing.T) {
			pr, pw := io.Pipe()
			req, err := http.NewRequest(http.MethodPost, w.url+"/upload", pr)
			if err != nil {
				t.Fatal(err)
			}
			req.ContentLength = c.length
			if c.trailer {
				req.Trailer = http.Header{"X-Sum": {"42"}}
			}
			if c.te {
				req.Header.Set("TE", "trailers")
			}
			wrote := sendHeldBack(pw, seen, nil)
			res, err := w.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if err := <-wrote; err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != http.StatusOK || string(got) != c.want {
				t.Errorf("%d %s, want 200 %s", res.StatusCode, got, c.want)
			}
			if c.length >= 0 && res.Close {
				t.Errorf("the connection closes after an upload of known length that was read through")
			}
		})
	}
}

// TestUploadToDyingInstance: an instance that dies with a streamed body half
// read fails the request with 502 (or, when the gateway closes the
// connection while the client still writes, with no answer), and the body
// is sent to no other instance, although PUT is idempotent: its first part
// is gone.
func TestUploadToDyingInstance(t *testing.T) { onStacks(t, testUploadToDyingInstance) }

func testUploadToDyingInstance(t *testing.T) {
	w := newWorld(t, "outlier: {errors: 1000, window: 1m, ejection: 10m}\n", Config{})
	var hits atomic.Int32
	seen := make(chan struct{}, 2)
	dying := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.CopyN(io.Discard, r.Body, uploadSeen)
		c, _, err := http.NewResponseController(rw).Hijack()
		if err == nil {
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
		select {
		case seen <- struct{}{}:
		default:
		}
	})
	w.register(t, "orders", "one", serveBackend(t, dying), "")
	w.register(t, "orders", "two", serveBackend(t, dying), "")
	for _, length := range []int64{uploadHead + uploadRest, -1} {
		hits.Store(0)
		pr, pw := io.Pipe()
		req, err := http.NewRequest(http.MethodPut, w.url+"/upload", pr)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = length
		stop, wrote := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(wrote)
			if _, err := pw.Write(bytes.Repeat([]byte("a"), uploadHead)); err != nil {
				return
			}
			select {
			case <-seen:
			case <-stop:
			}
			pw.Write(bytes.Repeat([]byte("b"), uploadRest))
			pw.Close()
		}()
		res, err := w.client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusBadGateway || res.Header.Get("X-Lanes-Error") != "upstream" {
				t.Errorf("length %d: %d %q %s, want 502 upstream", length, res.StatusCode, res.Header.Get("X-Lanes-Error"), body)
			}
		}
		pr.CloseWithError(io.ErrClosedPipe) // ends the writer, whatever the client did
		close(stop)
		<-wrote
		// Both instances count a request when it arrives; a retry, on
		// either, would arrive before the gateway answered.
		if n := hits.Load(); n != 1 {
			t.Errorf("length %d: the instances got %d requests, want 1 (no retry of a half-sent body)", length, n)
		}
		select {
		case <-seen:
		default:
		}
	}
}

// TestUploadMovesOnWhenRefused: an instance that refuses the connection got
// nothing, so a streamed body that no attempt has read yet moves on to
// another instance, whole.
func TestUploadMovesOnWhenRefused(t *testing.T) { onStacks(t, testUploadMovesOnWhenRefused) }

func testUploadMovesOnWhenRefused(t *testing.T) {
	w := newWorld(t, "outlier: {errors: 1000, window: 1m, ejection: 10m}\n", Config{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	w.register(t, "orders", "dead", dead, "")
	w.register(t, "orders", "good", byteCounter(t), "")
	body := strings.Repeat("x", 100<<10)
	for _, chunked := range []bool{false, true, false, true} {
		req := uploadReq(t, http.MethodPost, w.url+"/", strings.NewReader(body), chunked)
		r := doReq(t, w.client, req)
		if r.status != http.StatusOK || r.body != fmt.Sprint(len(body)) {
			t.Fatalf("chunked %v: %d %q, want 200 %d", chunked, r.status, r.body, len(body))
		}
	}
}

// TestExpectContinueStreams: a client that waits for 100 Continue gets it
// before it sends a large body, which then streams to the instance.
func TestExpectContinueStreams(t *testing.T) { onStacks(t, testExpectContinueStreams) }

func testExpectContinueStreams(t *testing.T) {
	w := newWorld(t, "", Config{})
	w.register(t, "orders", "up", byteCounter(t), "")
	const size = 200 << 10
	for _, chunked := range []bool{false, true} {
		c, err := net.DialTimeout("tcp", w.addr, waitFor)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(waitFor))
		framing := fmt.Sprintf("Content-Length: %d", size)
		if chunked {
			framing = "Transfer-Encoding: chunked"
		}
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\n%s\r\nExpect: 100-continue\r\n\r\n", framing)
		br := bufio.NewReader(c)
		res, err := http.ReadResponse(br, nil)
		if err != nil || res.StatusCode != http.StatusContinue {
			c.Close()
			t.Fatalf("chunked %v, before the body: %v, %v; want 100 Continue", chunked, res, err)
		}
		go func() {
			b := strings.Repeat("z", size)
			if chunked {
				fmt.Fprintf(c, "%x\r\n%s\r\n0\r\n\r\n", size, b)
			} else {
				io.WriteString(c, b)
			}
		}()
		res, err = http.ReadResponse(br, nil)
		if err != nil {
			c.Close()
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		c.Close()
		if want := fmt.Sprint(size); res.StatusCode != 200 || string(b) != want {
			t.Errorf("chunked %v: answer %d %q, want 200 %q", chunked, res.StatusCode, b, want)
		}
	}
}

// TestTruncatedUpload: a client that ends its side of the connection before
// the end of a streamed body of known length is at fault: 400
// bad_request_body, and the instance, which got a broken request, is not
// ejected for it; with a TE header too (handed to the net/http handler on
// the fast path), whose body was once read whole and sent on, short, as a
// whole request.
func TestTruncatedUpload(t *testing.T) { onStacks(t, testTruncatedUpload) }

func testTruncatedUpload(t *testing.T) {
	w := newWorld(t, "outlier: {errors: 2, window: 1m, ejection: 10m}\n", Config{})
	one := newBackend(t, "one", "")
	w.register(t, "orders", one.id, one.addr, "")
	for i := range 4 {
		c, err := net.DialTimeout("tcp", w.addr, waitFor)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(waitFor))
		te := "" // with a TE header, the fast path hands the request to the net/http handler
		if i%2 == 1 {
			te = "TE: trailers\r\n"
		}
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s", te, 2*uploadHead, strings.Repeat("a", uploadHead))
		c.(*net.TCPConn).CloseWrite()
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			c.Close()
			t.Fatalf("a truncated body: %v, want 400", err)
		}
		res.Body.Close()
		c.Close()
		if res.StatusCode != http.StatusBadRequest || res.Header.Get(hError) != codeBadBody {
			t.Fatalf("a truncated body (%q): %d %q, want 400 %s", te, res.StatusCode, res.Header.Get(hError), codeBadBody)
		}
	}
	if r := w.get(t, "/", nil); r.status != http.StatusOK {
		t.Errorf("after truncated bodies: %d %s: the instance was ejected", r.status, r.body)
	}
}

// TestEarlyAnswerToUpload: an instance that answers a large upload before it
// reads it (401, say) and closes the connection has its answer reach the
// client, as net/http's transport and server pass it on: the gateway takes
// the answer although writing the body failed, and closes the client's
// connection without resetting it under the answer.
func TestEarlyAnswerToUpload(t *testing.T) { onStacks(t, testEarlyAnswerToUpload) }

func testEarlyAnswerToUpload(t *testing.T) {
	w := newWorld(t, "", Config{})
	addr := serveBackend(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		http.Error(rw, "no", http.StatusUnauthorized)
	}))
	w.register(t, "orders", "up", addr, "")
	body := make([]byte, 8<<20) // more than the instance's server discards before it closes
	for range 3 {
		req, err := http.NewRequest(http.MethodPost, w.url+"/", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		r := doReq(t, w.client, req)
		if r.status != http.StatusUnauthorized || r.body != "no\n" {
			t.Fatalf("%d %q, want the instance's 401", r.status, r.body)
		}
	}
}

// byteCounter is a backend that answers with the length of the request body
// it read.
func byteCounter(t testing.TB) string {
	return serveBackend(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(rw, "%d", n)
	}))
}

// deafUpload is larger than what the kernel buffers of a connection take
// (tcp_wmem and tcp_rmem allow a few MiB), so that an instance that reads
// nothing blocks the writer.
const deafUpload = 16 << 20

// TestUploadToDeafInstance: an instance that accepts the connection but
// reads nothing of the request (hung, or paused with SIGSTOP, whose kernel
// still accepts connections and buffers what it can) fails the attempt once
// it has taken none of an upload for the upstream write timeout: the client
// gets 502 upstream that names the timeout, with the lane headers, never a
// hang, and the instance is ejected. The response-header timeout is far
// off: the write bound alone ends the attempt.
func TestUploadToDeafInstance(t *testing.T) { onStacks(t, testUploadToDeafInstance) }

func testUploadToDeafInstance(t *testing.T) {
	const timeout = 200 * time.Millisecond
	for _, length := range []int64{deafUpload, -1} {
		t.Run(fmt.Sprintf("length=%d", length), func(t *testing.T) {
			w := newWorld(t, "outlier: {errors: 1, window: 1m, ejection: 10m}\n",
				Config{UpstreamWriteTimeout: timeout, ResponseHeaderTimeout: time.Hour})
			w.register(t, "orders", "deaf", deaf(t, ""), "")
			req := uploadReq(t, http.MethodPut, w.url+"/upload", bytes.NewReader(make([]byte, deafUpload)), length < 0)
			r := doReq(t, w.client, req)
			if r.status != http.StatusBadGateway || r.header.Get(hError) != codeUpstream ||
				!strings.Contains(r.body, `"deaf"`) || !strings.Contains(r.body, "upstream write timeout") {
				t.Fatalf("%d %q %q, want 502 upstream naming the instance and the upstream write timeout", r.status, r.header.Get(hError), r.body)
			}
			if got := r.header.Get(hLaneServed); got != "baseline" {
				t.Errorf("x-lane-served %q, want baseline", got)
			}
			// Reported: the instance is out of the eligible set.
			w.register(t, "orders", "good", byteCounter(t), "")
			eventually(t, "the deaf instance to be ejected", func() bool {
				d, err := w.engine.Service("orders").Resolve(routing.Request{})
				return err == nil && strings.Join(d.Eligible, " ") == "good"
			})
		})
	}
}

// TestLongUploadThenAnswer: the wait for the answer's headers starts once the
// request is written: an upload that takes longer than the
// response-header timeout is answered. The client sends the rest of the
// body once a request to a silent instance, sent after the upload started,
// has timed out.
func TestLongUploadThenAnswer(t *testing.T) { onStacks(t, testLongUploadThenAnswer) }

func testLongUploadThenAnswer(t *testing.T) {
	const timeout = 500 * time.Millisecond
	w := newWorld(t, "", Config{ResponseHeaderTimeout: timeout, Routes: []Route{
		{Prefix: "/silent", Service: "silent"}, {Prefix: "/", Service: "orders"}}})
	w.register(t, "silent", "silent", deaf(t, ""), "")
	seen := make(chan struct{}, 1)
	w.register(t, "orders", "up", serveBackend(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		n, _ := io.CopyN(io.Discard, r.Body, uploadSeen)
		seen <- struct{}{}
		m, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(rw, "%d", n+m)
	})), "")
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, w.url+"/upload", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = uploadHead + uploadRest
	wrote := sendHeldBack(pw, seen, func() error {
		res, err := w.client.Get(w.url + "/silent")
		if err != nil {
			return err
		}
		res.Body.Close()
		if res.StatusCode != http.StatusBadGateway {
			return fmt.Errorf("the silent instance: %d, want 502 after the response-header timeout", res.StatusCode)
		}
		return nil
	})
	r := doReq(t, w.client, req)
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprint(uploadHead + uploadRest); r.status != http.StatusOK || r.body != want {
		t.Errorf("%d %q, want 200 %s", r.status, r.body, want)
	}
}

// TestUploadThenSilence: an instance that reads a whole upload and then
// never answers fails the attempt once the response-header timeout has
// passed since the end of the write: the fast stack, which
// awaits the answer's head while the body streams, bounds that wait once
// the write is done. The client gets 502 upstream naming the timeout.
func TestUploadThenSilence(t *testing.T) { onStacks(t, testUploadThenSilence) }

func testUploadThenSilence(t *testing.T) {
	w := newWorld(t, "", Config{ResponseHeaderTimeout: 300 * time.Millisecond})
	w.register(t, "orders", "silent", serveBackend(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		<-r.Context().Done() // the gateway gave up and closed the connection
	})), "")
	for _, chunked := range []bool{false, true} {
		req := uploadReq(t, http.MethodPost, w.url+"/upload", bytes.NewReader(make([]byte, uploadHead+uploadRest)), chunked)
		r := doReq(t, w.client, req)
		if r.status != http.StatusBadGateway || r.header.Get(hError) != codeUpstream || !strings.Contains(r.body, "timeout awaiting response headers") {
			t.Errorf("chunked %v: %d %q %q, want 502 upstream naming the response-header timeout", chunked, r.status, r.header.Get(hError), r.body)
		}
	}
}

// TestEarlyAnswerFromDeafInstance: an instance that answers an upload (413)
// after its head and then reads no more of it, without closing the
// connection, has its answer reach the client, with a body of
// known length or chunked, although the upstream write timeout is far off:
// the answer is read while the body is written (net/http's transport does
// so), not found once the write has timed out.
func TestEarlyAnswerFromDeafInstance(t *testing.T) { onStacks(t, testEarlyAnswerFromDeafInstance) }

func testEarlyAnswerFromDeafInstance(t *testing.T) {
	w := newWorld(t, "", Config{UpstreamWriteTimeout: time.Hour, ResponseHeaderTimeout: time.Hour})
	w.register(t, "orders", "deaf", deaf(t, "HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 3\r\n\r\nno\n"), "")
	for _, chunked := range []bool{false, true} {
		req := uploadReq(t, http.MethodPost, w.url+"/upload", bytes.NewReader(make([]byte, deafUpload)), chunked)
		r := doReq(t, w.client, req)
		if r.status != http.StatusRequestEntityTooLarge || r.body != "no\n" || r.header.Get(hLaneServed) != "baseline" {
			t.Errorf("chunked %v: %d %q (x-lane-served %q), want the instance's 413", chunked, r.status, r.body, r.header.Get(hLaneServed))
		}
	}
}

// The uploads of TestEarlyAnswerMidUpload: the client sends earlyHead bytes
// of the body, then holds the rest, earlyRest, back until it has the
// answer. earlyHead is over the 256 KiB of a chunked body that net/http's
// server reads before it answers.
const (
	earlyHead = 1 << 20
	earlyRest = 7 << 20
)

// smuggled is a request in the bytes of a body that an instance did not
// read: the gateway must never read it as a request.
const smuggled = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"

// TestEarlyAnswerMidUpload: an instance that answers an upload (413, 401)
// as soon as it has the head, without reading the body, has its answer
// reach the client while the client still holds most of the body back, on
// either stack (net/http's transport reads the answer while it writes the
// body): the instance is a net/http server, which answers and closes the
// connection, or a raw one, which answers and then reads no more, without
// closing. The client gets the instance's status and body; the call is no
// failure of the instance (one failure would eject it) and is not retried
// (PUT, with two instances); the client's connection then closes, and the
// rest of the body, a request in its bytes, is never read as a request.
func TestEarlyAnswerMidUpload(t *testing.T) { onStacks(t, testEarlyAnswerMidUpload) }

func testEarlyAnswerMidUpload(t *testing.T) {
	kinds := []struct {
		name  string
		serve func(t *testing.T, status int, hits *atomic.Int32) string
	}{
		{"net-http", func(t *testing.T, status int, hits *atomic.Int32) string {
			return serveBackend(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				http.Error(rw, "no", status)
			}))
		}},
		{"raw", func(t *testing.T, status int, hits *atomic.Int32) string {
			return deafCounting(t, fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Length: 3\r\n\r\nno\n", status, http.StatusText(status)), hits)
		}},
	}
	for _, kind := range kinds {
		for _, status := range []int{http.StatusRequestEntityTooLarge, http.StatusUnauthorized} {
			for _, chunked := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%d/chunked=%v", kind.name, status, chunked), func(t *testing.T) {
					w := newWorld(t, "outlier: {errors: 1, window: 1m, ejection: 10m}\n", Config{})
					var hits atomic.Int32
					w.register(t, "orders", "one", kind.serve(t, status, &hits), "")
					w.register(t, "orders", "two", kind.serve(t, status, &hits), "")
					res, extra := uploadHeldBack(t, w.addr, chunked)
					if res.status != status || res.body != "no\n" || res.header.Get(hLaneServed) != "baseline" {
						t.Errorf("%d %q (x-lane-served %q), want the instance's %d", res.status, res.body, res.header.Get(hLaneServed), status)
					}
					if extra != "" {
						t.Errorf("after the answer, the gateway sent %q: the rest of the body was read as a request", trim([]byte(extra)))
					}
					if n := hits.Load(); n != 1 {
						t.Errorf("the instances got %d requests, want 1 (no retry, nothing smuggled)", n)
					}
					d, err := w.engine.Service("orders").Resolve(routing.Request{})
					if err != nil || len(d.Eligible) != 2 {
						t.Errorf("eligible %v (%v), want both instances: the answer is no failure", d.Eligible, err)
					}
				})
			}
		}
	}
}

// uploadHeldBack sends a PUT with an upload of earlyHead+earlyRest bytes
// (of known length, or chunked) to the gateway at addr, over TCP: the head
// and earlyHead bytes of the body, then, once it has read an answer, the
// rest, which starts with a request (smuggled). It returns the answer and
// what the gateway sent after it before it closed the connection. An
// answer that does not come within waitFor fails the test.
func uploadHeldBack(t *testing.T, addr string, chunked bool) (reply, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, waitFor)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(waitFor))
	framing := fmt.Sprintf("Content-Length: %d", earlyHead+earlyRest)
	if chunked {
		framing = "Transfer-Encoding: chunked"
	}
	head := bytes.Repeat([]byte("a"), earlyHead)
	rest := append([]byte(smuggled), bytes.Repeat([]byte("b"), earlyRest-len(smuggled))...)
	if chunked {
		head = append(fmt.Appendf(nil, "%x\r\n", len(head)), append(head, "\r\n"...)...)
		rest = append(fmt.Appendf(nil, "%x\r\n", len(rest)), append(rest, "\r\n0\r\n\r\n"+smuggled...)...)
	}
	if _, err := fmt.Fprintf(c, "PUT /upload HTTP/1.1\r\nHost: x\r\n%s\r\n\r\n%s", framing, head); err != nil {
		t.Fatalf("sending the first %d bytes of the body: %v", earlyHead, err)
	}
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer while the client held back the rest of the body: %v", err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatalf("reading the answer's body: %v", err)
	}
	// The gateway may have closed the connection: no matter. What it sends
	// after the answer is read up to its end, or a reset.
	c.Write(rest)
	after, _ := io.ReadAll(br)
	return reply{status: res.StatusCode, header: res.Header, body: string(body)}, string(after)
}

// TestInterimAnswerMidUpload: a 1xx answer that an instance sends while an
// upload streams (103 Early Hints, after some of the body) reaches the
// client as it comes, before the end of the body, and the
// final answer after it.
func TestInterimAnswerMidUpload(t *testing.T) { onStacks(t, testInterimAnswerMidUpload) }

func testInterimAnswerMidUpload(t *testing.T) {
	w := newWorld(t, "", Config{})
	w.register(t, "orders", "up", serveBackend(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		n, _ := io.CopyN(io.Discard, r.Body, uploadSeen)
		rw.Header().Set("Link", "</style.css>; rel=preload")
		rw.WriteHeader(http.StatusEarlyHints)
		rw.Header().Del("Link")
		m, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(rw, "%d", n+m)
	})), "")
	for _, chunked := range []bool{false, true} {
		c, err := net.DialTimeout("tcp", w.addr, waitFor)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(waitFor))
		framing := fmt.Sprintf("Content-Length: %d", uploadHead+uploadRest)
		head, rest := strings.Repeat("a", uploadHead), strings.Repeat("b", uploadRest)
		if chunked {
			framing = "Transfer-Encoding: chunked"
			head, rest = fmt.Sprintf("%x\r\n%s\r\n", len(head), head), fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(rest), rest)
		}
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\n%s\r\n\r\n%s", framing, head)
		br := bufio.NewReader(c)
		res, err := http.ReadResponse(br, nil)
		if err != nil || res.StatusCode != http.StatusEarlyHints || res.Header.Get("Link") == "" {
			c.Close()
			t.Fatalf("chunked %v, while the client held back the rest of the body: %v, %v; want 103 Early Hints with its Link", chunked, res, err)
		}
		io.WriteString(c, rest)
		res, err = http.ReadResponse(br, nil)
		if err != nil {
			c.Close()
			t.Fatalf("chunked %v: the final answer: %v", chunked, err)
		}
		b, _ := io.ReadAll(res.Body)
		c.Close()
		if want := fmt.Sprint(uploadHead + uploadRest); res.StatusCode != http.StatusOK || string(b) != want {
			t.Errorf("chunked %v: %d %q, want 200 %q", chunked, res.StatusCode, b, want)
		}
	}
}

// deaf is an instance that accepts connections and never reads them, until
// the test ends; with an answer, it reads the head of the first request of
// each, answers that, and then reads no more. It returns its address.
func deaf(t testing.TB, answer string) string { return deafCounting(t, answer, nil) }

// deafCounting is deaf, counting in hits (when not nil) the request heads
// it read.
func deafCounting(t testing.TB, answer string, hits *atomic.Int32) string {
	var conns []net.Conn // the accept loop's, then, once it has returned, this cleanup's
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	return acceptLoop(t, func(c net.Conn) {
		conns = append(conns, c)
		if answer != "" {
			c.SetReadDeadline(time.Now().Add(waitFor))
			if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
				if hits != nil {
					hits.Add(1)
				}
				io.WriteString(c, answer)
			}
		}
	})
}

// sendHeldBack writes an upload to pw and closes it: uploadHead bytes, then,
// once the instance has read some of them (seen) and between (if any) has
// returned nil, uploadRest more. The channel gets the error that ended it,
// or nil.
func sendHeldBack(pw *io.PipeWriter, seen <-chan struct{}, between func() error) <-chan error {
	wrote := make(chan error, 1)
	go func() {
		defer pw.Close()
		if _, err := pw.Write(bytes.Repeat([]byte("a"), uploadHead)); err != nil {
			wrote <- err
			return
		}
		select {
		case <-seen:
		case <-time.After(waitFor):
			wrote <- fmt.Errorf("the instance had not read %d bytes of the body %s after the client sent %d", uploadSeen, waitFor, uploadHead)
			return
		}
		if between != nil {
			if err := between(); err != nil {
				wrote <- err
				return
			}
		}
		_, err := pw.Write(bytes.Repeat([]byte("b"), uploadRest))
		wrote <- err
	}()
	return wrote
}

// TestEarlySuccessKeepsUpload: an instance that answers an upload with a
// 2xx head before it has read the body, and then reads the body to its end
// (a full-duplex handler, net/http's EnableFullDuplex), gets the whole
// body, of known length or chunked, and the client the whole
// answer: only an answer that refuses the upload (300 and over) stops it.
func TestEarlySuccessKeepsUpload(t *testing.T) { onStacks(t, testEarlySuccessKeepsUpload) }

func testEarlySuccessKeepsUpload(t *testing.T) {
	w := newWorld(t, "", Config{})
	w.register(t, "orders", "duplex", serveBackend(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(rw)
		if err := rc.EnableFullDuplex(); err != nil {
			http.Error(rw, err.Error(), http.StatusInternalServerError)
			return
		}
		rw.WriteHeader(http.StatusOK)
		rc.Flush()
		n, err := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(rw, "%d %v", n, err)
	})), "")
	const total = earlyHead + earlyRest
	for _, chunked := range []bool{false, true} {
		req := uploadReq(t, http.MethodPut, w.url+"/upload", bytes.NewReader(make([]byte, total)), chunked)
		r := doReq(t, w.client, req)
		if want := fmt.Sprintf("%d <nil>", total); r.status != http.StatusOK || r.body != want {
			t.Errorf("chunked %v: %d %q, want 200 %q: the instance that answered first must get the whole upload", chunked, r.status, r.body, want)
		}
	}
}
