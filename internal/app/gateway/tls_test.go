package gateway

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/lanesdev/lanes/internal/lib/tlsfiles"
	"github.com/lanesdev/lanes/internal/testkit/tlstest"
)

// ServeTLS serves HTTP/1.1 and HTTP/2 (by ALPN) over TLS, with either
// HTTP/1.1 stack configured (TLS is served on net/http), a lane host on a
// wildcard certificate, and tells the instance the request came over https.
func TestServeTLS(t *testing.T) { onStacks(t, testServeTLS) }

func testServeTLS(t *testing.T) {
	files, err := tlstest.Write(filepath.Join(t.TempDir(), "tls"), "127.0.0.1", "*.lanes.test")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := tlsfiles.Server(files.ServerCert, files.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	roots, err := tlsfiles.Client(files.CA)
	if err != nil {
		t.Fatal(err)
	}
	for _, stack := range []string{HTTP1Fast, HTTP1Std} {
		t.Run(stack, func(t *testing.T) {
			w := newWorldOn(t, "", Config{HTTP1: stack, Domain: "lanes.test"}, nil, nil, srv)
			twoLanes(t, w)
			for _, tc := range []struct {
				h2          bool
				url, served string
			}{
				{false, w.url + "/", "base"},
				{true, w.url + "/", "base"},
				{false, "https://alice.lanes.test/", "alice-1"},
				{true, "https://alice.lanes.test/", "alice-1"},
			} {
				var p http.Protocols
				p.SetHTTP1(!tc.h2)
				p.SetHTTP2(tc.h2)
				var d net.Dialer
				tr := &http.Transport{TLSClientConfig: roots.Clone(), Protocols: &p,
					DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
						return d.DialContext(ctx, network, w.addr)
					}}
				r := do(t, &http.Client{Transport: tr, Timeout: waitFor}, http.MethodGet, tc.url, nil)
				tr.CloseIdleConnections()
				wantProto := "HTTP/1.1"
				if tc.h2 {
					wantProto = "HTTP/2.0"
				}
				if r.status != http.StatusOK || r.echo.ID != tc.served || r.proto != wantProto {
					t.Errorf("%s (HTTP/2 %v): %d %s from %q, want 200 %s from %q", tc.url, tc.h2, r.status, r.proto, r.echo.ID, wantProto, tc.served)
				}
				if got := r.echo.hdr(t, "X-Forwarded-Proto"); got != "https" {
					t.Errorf("%s (HTTP/2 %v): X-Forwarded-Proto %q upstream, want https", tc.url, tc.h2, got)
				}
			}
			// A client that does not trust the CA is refused in the handshake.
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			if resp, err := (&http.Client{Transport: tr, Timeout: waitFor}).Get(w.url + "/"); err == nil {
				resp.Body.Close()
				t.Errorf("a client without the CA got %d", resp.StatusCode)
			}
		})
	}
}
