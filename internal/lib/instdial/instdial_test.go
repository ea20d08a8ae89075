package instdial

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/lib/routedcall"
	"github.com/lanesdev/lanes/internal/testkit/leaktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Options()...) }

// proxy is a CONNECT proxy on loopback that connects only to allowed, and
// answers 502 for anything else.
func proxy(t *testing.T, allowed string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil || req.Method != http.MethodConnect || req.Host != allowed {
					io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 11\r\n\r\nnot allowed")
					return
				}
				up, err := net.Dial("tcp", allowed)
				if err != nil {
					return
				}
				defer up.Close()
				io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\n")
				go io.Copy(up, br)
				io.Copy(c, up)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return "http://" + ln.Addr().String()
}

func TestThroughProxy(t *testing.T) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "instance") })}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	t.Setenv(Env, proxy(t, ln.Addr().String()))

	dial := Dialer(nil)
	tr := &http.Transport{DialContext: dial}
	defer tr.CloseIdleConnections()
	res, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if string(body) != "instance" {
		t.Errorf("through the proxy: %q", body)
	}

	// A connection the proxy does not make fails as a dial does: the
	// routed call counts the instance unreachable and moves on.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = dial(ctx, "tcp", "127.0.0.1:1")
	if err == nil || !routedcall.Unsent(err) || !strings.Contains(err.Error(), "not allowed") {
		t.Errorf("a refused CONNECT: %v; want a dial error (unsent) with the proxy's reason", err)
	}
	// The address rules still apply, before the proxy hears of it.
	if _, err := dial(ctx, "tcp", "169.254.169.254:80"); err == nil || !routedcall.Unsent(err) || strings.Contains(err.Error(), "not allowed") {
		t.Errorf("a metadata address: %v; want the address rules' refusal", err)
	}
}
