package cli

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/internal/lib/tlsfiles"
	"github.com/lanesdev/lanes/internal/testkit/tlstest"
	"github.com/lanesdev/lanes/registry"
)

// TestUpTLS runs `lanes up` with a certificate for its listeners: it prints
// https URLs and the CA variable; the CLI and the admin API client verify
// the admin API with the CA file and refuse it without; the gateway serves
// a lane host on the wildcard certificate, over HTTP/1.1 and HTTP/2, and
// tells the instance the request came over https.
func TestUpTLS(t *testing.T) {
	files, err := tlstest.Write(filepath.Join(t.TempDir(), "tls"), "127.0.0.1", "localhost", "*.lanes.localhost")
	if err != nil {
		t.Fatal(err)
	}
	u := startUp(t, "up", "--route", "/=web", "--tls-cert", files.ServerCert, "--tls-key", files.ServerKey)
	out := u.Stdout.String()
	for _, want := range []string{"LANES_REGISTRY=https://", "LANES_TRACES=https://", "LANES_CA_FILE="} {
		if !strings.Contains(out, want) {
			t.Errorf("the output has no %q:\n%s", want, out)
		}
	}
	if !strings.HasPrefix(u.admin, "https://") || !strings.HasPrefix(u.gateway, "https://") || !strings.HasPrefix(u.traces, "https://") {
		t.Fatalf("addresses %s %s %s: want https://", u.admin, u.gateway, u.traces)
	}
	if code, out, errOut := run(t, "", "ls", "--admin", u.admin, "--token", u.token, "--ca-file", files.CA); code != 0 {
		t.Errorf("ls --ca-file: exit %d %s %s", code, out, errOut)
	}
	if code, _, errOut := run(t, "", "ls", "--admin", u.admin, "--token", u.token); code == 0 || !strings.Contains(errOut, "certificate signed by unknown authority") {
		t.Errorf("ls without the CA file: exit %d, stderr %q; want a refusal naming the unknown authority", code, errOut)
	}
	if code, _, errOut := run(t, "", "ls", "--admin", u.admin, "--token", u.token, "--ca-file", files.ServerKey); code != 2 || !strings.Contains(errOut, "--ca-file") || !strings.Contains(errOut, files.ServerKey) {
		t.Errorf("ls --ca-file with a key in it: exit %d, stderr %q; want exit 2 naming the flag and the file", code, errOut)
	}

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	admin := func(token string) *adminclient.Client {
		c, err := adminclient.New(u.admin, token, adminclient.WithCAFile(files.CA))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	tok, err := admin(u.token).CreateToken(ctx, adminapi.TokenRequest{Lane: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, "web-alice")
	reg := adminclient.NewRegistry(admin(tok.Secret), adminclient.WithLogger(quiet))
	t.Cleanup(func() { reg.Close() })
	l, err := reg.Register(ctx, registry.Instance{Service: "web", ID: "web-alice", Addr: b.addr, Lane: "alice"}, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })

	pool, err := tlsfiles.Client(files.CA)
	if err != nil {
		t.Fatal(err)
	}
	gwHost := strings.TrimPrefix(u.gateway, "https://")
	for _, h2 := range []bool{false, true} {
		var p http.Protocols
		p.SetHTTP1(!h2)
		p.SetHTTP2(h2)
		d := &net.Dialer{Timeout: 5 * time.Second}
		tr := &http.Transport{TLSClientConfig: pool.Clone(), Protocols: &p,
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return d.DialContext(ctx, network, gwHost)
			}}
		t.Cleanup(tr.CloseIdleConnections)
		c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		if a := expectBackend(t, c, "https://alice.lanes.localhost/", "web-alice", nil); a.Proto != "https" {
			t.Errorf("HTTP/2 %v: the instance got X-Forwarded-Proto %q, want https", h2, a.Proto)
		}
	}
}
