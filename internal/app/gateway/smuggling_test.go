package gateway

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/app/gateway/upstream"
	"github.com/lanesdev/lanes/internal/testkit/smuggletest"
)

// TestSmuggling sends the classic request-smuggling and header-injection
// bytes to the gateway over TCP: each is refused, or read as RFC 9112 says
// and forwarded once with the body the RFC gives it; no smuggled request
// reaches the backend.
func TestSmuggling(t *testing.T) { onStacks(t, testSmuggling) }

func testSmuggling(t *testing.T) {
	w := newWorld(t, "", Config{})
	rec, err := smuggletest.NewRecorder()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Close() })
	w.register(t, "orders", "rec", rec.Addr, "")
	for _, c := range smuggletest.Cases {
		t.Run(c.Name, func(t *testing.T) {
			rec.Reset()
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			res := smuggletest.Send(ctx, w.addr, c)
			if err := smuggletest.Check(c, res, rec.Requests()); err != nil {
				t.Errorf("%s (RFC %s): %v\nupstream bytes: %q", c.Name, c.RFC, err, trim(rec.Raw()))
			}
			checkRefusal(t, res)
		})
	}
}

// checkRefusal checks the x-lanes-error of a refused request: the fast path
// answers every refusal with the gateway's error; net/http's server answers
// a head it refuses with its own, and the std path's handler a body that
// breaks its framing with bad_request_body.
func checkRefusal(t *testing.T, res smuggletest.Result) {
	t.Helper()
	if res.Status < 400 {
		return
	}
	code := res.Header.Get(hError)
	switch {
	case stackOf(t) == HTTP1Fast && code == "":
		t.Errorf("refused with %d without %s", res.Status, hError)
	case stackOf(t) == HTTP1Std && code != "" && code != codeBadBody:
		t.Errorf("refused with %d, %s %q; want none or %s", res.Status, hError, code, codeBadBody)
	}
}

func trim(b []byte) []byte {
	if len(b) > 400 {
		return b[:400]
	}
	return b
}

// TestBadBodyIsTheClients: a chunked body that breaks its framing is the
// client's fault: 400 bad_request_body, the connection closed, and the
// instance, which got a broken request, is not ejected for it.
func TestBadBodyIsTheClients(t *testing.T) { onStacks(t, testBadBodyIsTheClients) }

func testBadBodyIsTheClients(t *testing.T) {
	w := newWorld(t, "outlier: {errors: 2, window: 1m, ejection: 10m}\n", Config{})
	one, two := newBackend(t, "one", ""), newBackend(t, "two", "")
	w.register(t, "orders", one.id, one.addr, "")
	w.register(t, "orders", two.id, two.addr, "")
	bad := smuggletest.Case{Name: "bad chunk", Want: []int{400},
		Raw: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n\r\n"}
	// With a TE header, the fast path hands the request to the net/http
	// handler, where the body streams too.
	badTE := bad
	badTE.Raw = strings.Replace(bad.Raw, "Host: x\r\n", "Host: x\r\nTE: trailers\r\n", 1)
	// Round robin: each instance gets three broken requests, enough to eject
	// it if they counted.
	for i := range 6 {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		c := bad
		if i%2 == 1 {
			c = badTE
		}
		res := smuggletest.Send(ctx, w.addr, c)
		cancel()
		if len(res.Statuses) != 1 || res.Status != http.StatusBadRequest {
			t.Fatalf("a bad chunk (%q): answers %v, want one 400 and the connection closed", c.Raw, res)
		}
		if got := res.Header.Get(hError); got != codeBadBody {
			t.Fatalf("a bad chunk (%q): %s %q, want %s", c.Raw, hError, got, codeBadBody)
		}
	}
	h1, h2 := one.hits.Load(), two.hits.Load()
	for range 10 {
		w.get(t, "/", nil)
	}
	if one.hits.Load() == h1 || two.hits.Load() == h2 {
		t.Errorf("after broken request bodies, instance one took %d and two %d of 10 requests: one was ejected",
			one.hits.Load()-h1, two.hits.Load()-h2)
	}
}

// TestHeadSizeLimit: both HTTP/1.1 paths take a request head of
// maxHeaderBytes; the fast path answers 431 to one a byte longer, net/http
// to one longer by more than its read-ahead (see maxHeaderBytes).
func TestHeadSizeLimit(t *testing.T) { onStacks(t, testHeadSizeLimit) }

func testHeadSizeLimit(t *testing.T) {
	w := newWorld(t, "", Config{})
	b := newBackend(t, "one", "")
	w.register(t, "orders", b.id, b.addr, "")
	over := maxHeaderBytes + 1
	if stackOf(t) == HTTP1Std {
		over += stdHeaderSlack
	}
	for _, tc := range []struct {
		size int
		want int
	}{
		{maxHeaderBytes - 1, http.StatusOK},
		{maxHeaderBytes, http.StatusOK},
		{over, http.StatusRequestHeaderFieldsTooLarge},
		{over + 1, http.StatusRequestHeaderFieldsTooLarge},
		{4 * maxHeaderBytes, http.StatusRequestHeaderFieldsTooLarge},
	} {
		raw := headOfSize(tc.size)
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		res := smuggletest.Send(ctx, w.addr, smuggletest.Case{Raw: raw})
		cancel()
		if res.Status != tc.want {
			t.Errorf("a head of %d bytes (the limit %+d): answered %v, want %d", len(raw), tc.size-maxHeaderBytes, res, tc.want)
		}
		if got := res.Header.Get(hError); stackOf(t) == HTTP1Fast && res.Status == http.StatusRequestHeaderFieldsTooLarge && got != codeHeadTooLarge {
			t.Errorf("a head of %d bytes: %s %q, want %s", len(raw), hError, got, codeHeadTooLarge)
		}
	}
}

// TestResponseHeadSizeLimit: both HTTP/1.1 paths take an instance's answer
// whose head is upstream.MaxResponseHead bytes long, and fail one a byte longer with
// 502 upstream that names the limit, as they log it.
func TestResponseHeadSizeLimit(t *testing.T) { onStacks(t, testResponseHeadSizeLimit) }

func testResponseHeadSizeLimit(t *testing.T) {
	w := newWorld(t, "outlier: {errors: 1000, window: 1m, ejection: 10m}\n", Config{})
	size := make(chan int, 1)
	w.register(t, "orders", "big", rawBackend(t, func() string {
		const start, end = "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\nX-Pad: ", "\r\n\r\n"
		return start + strings.Repeat("a", <-size-len(start)-len(end)) + end + "ok"
	}), "")
	for _, tc := range []struct {
		size int
		want int
	}{
		{upstream.MaxResponseHead - 1, http.StatusOK},
		{upstream.MaxResponseHead, http.StatusOK},
		{upstream.MaxResponseHead + 1, http.StatusBadGateway},
		{4 * upstream.MaxResponseHead, http.StatusBadGateway},
	} {
		size <- tc.size
		r := w.get(t, "/", nil)
		if r.status != tc.want {
			t.Errorf("an answer head of %d bytes (the limit %+d): %d %q, want %d", tc.size, tc.size-upstream.MaxResponseHead, r.status, r.body, tc.want)
			continue
		}
		if tc.want == http.StatusOK {
			if r.body != "ok" || len(r.header.Get("X-Pad")) == 0 {
				t.Errorf("an answer head of %d bytes: %q, X-Pad of %d bytes; want the answer whole", tc.size, r.body, len(r.header.Get("X-Pad")))
			}
			continue
		}
		if r.header.Get(hError) != codeUpstream || !strings.Contains(r.body, upstream.ErrResponseHeadTooLarge.Error()) {
			t.Errorf("an answer head of %d bytes: %s %q, %q; want %s and %q", tc.size, hError, r.header.Get(hError), r.body, codeUpstream, upstream.ErrResponseHeadTooLarge)
		}
	}
}

// rawBackend is an instance that answers each request, one per connection,
// with the bytes that answer returns, and closes the connection.
func rawBackend(t testing.TB, answer func() string) string {
	return acceptLoop(t, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(waitFor))
		if req, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			io.Copy(io.Discard, req.Body)
			io.WriteString(c, answer())
		}
		c.Close()
	})
}

// headOfSize is a GET request whose head is n bytes long, its last CRLF
// included.
func headOfSize(n int) string {
	const start, end = "GET / HTTP/1.1\r\nHost: x\r\nX-Pad: ", "\r\n\r\n"
	return start + strings.Repeat("a", n-len(start)-len(end)) + end
}
