package sidecar

import (
	"bufio"
	"net/http"
	"strings"
	"testing"

	"github.com/lanesdev/lanes/laneshttp"
)

// FuzzTarget: whatever request line and Host the app sends, the outbound
// proxy decides without a panic: a lanes service by its bare name, or with
// --pass-through another host (never the proxy itself, never one that came
// back); anything else refused with a message.
func FuzzTarget(f *testing.F) {
	for _, s := range [][2]string{
		{"GET http://orders/x HTTP/1.1", "orders"},
		{"GET /x HTTP/1.1", "orders:8080"},
		{"GET /x HTTP/1.1", "127.0.0.1:3128"},
		{"CONNECT example.com:443 HTTP/1.1", "example.com:443"},
		{"GET https://orders/ HTTP/1.1", "orders"},
		{"GET http://[::1]:80/ HTTP/1.1", "x"},
		{"GET http://Orders./ HTTP/1.1", ""},
		{"GET /x HTTP/1.1", "example.com"},
	} {
		f.Add(s[0], s[1], false)
		f.Add(s[0], s[1], true)
	}
	const own = "127.0.0.1:3128"
	f.Fuzz(func(t *testing.T, line, host string, pass bool) {
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(line + "\r\nHost: " + host + "\r\n\r\n")))
		if err != nil {
			return // net/http's server refuses it before the handler
		}
		s := &Sidecar{cfg: Config{PassThrough: pass}}
		target, status, msg := s.target(req, own)
		if status != 0 {
			if target != "" || !strings.HasPrefix(msg, "lanes sidecar: ") {
				t.Fatalf("%q Host %q: refused %d with target %q, message %q", line, host, status, target, msg)
			}
			return
		}
		switch {
		case target == "":
			t.Fatalf("%q Host %q: no target", line, host)
		case target == own:
			t.Fatalf("%q Host %q: the proxy itself", line, host)
		case req.Method == http.MethodConnect:
			t.Fatalf("%q: CONNECT taken", line)
		case !laneshttp.SingleLabel(target) && !pass:
			t.Fatalf("%q Host %q: %q is not a service, taken without --pass-through", line, host, target)
		}
	})
}
