package tlsfiles_test

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/lib/tlsfiles"
	"github.com/lanesdev/lanes/internal/testkit/tlstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestErrorsNameTheFiles(t *testing.T) {
	dir := t.TempDir()
	f, err := tlstest.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tlsfiles.Server(f.ServerCert, f.ClientKey); err == nil || !strings.Contains(err.Error(), f.ClientKey) || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("a certificate with another's key: %v", err)
	}
	missing := filepath.Join(dir, "missing.pem")
	if _, err := tlsfiles.Server(missing, f.ServerKey); err == nil || strings.Count(err.Error(), missing) != 1 {
		t.Errorf("a missing certificate: %v, want its path named once", err)
	}
	var ce *tlsfiles.CAError
	if _, err := tlsfiles.Client(f.ServerKey); !errors.As(err, &ce) || ce.File != f.ServerKey || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("a key as the CA file: %v", err)
	}
	if tc, err := tlsfiles.Client(""); tc != nil || err != nil {
		t.Errorf("no CA file: %v %v, want the system's roots (nil)", tc, err)
	}
}

// Pinned accepts the certificate the server serves, whatever the name, and
// no other.
func TestPinned(t *testing.T) {
	a, err := tlstest.Write(filepath.Join(t.TempDir(), "a"), "lanes.example.com")
	if err != nil {
		t.Fatal(err)
	}
	b, err := tlstest.Write(filepath.Join(t.TempDir(), "b"), "lanes.example.com")
	if err != nil {
		t.Fatal(err)
	}
	srvA, err := tlsfiles.Server(a.ServerCert, a.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	srvB, err := tlsfiles.Server(b.ServerCert, b.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(t, srvA, tlsfiles.Pinned(srvA)); err != nil {
		t.Errorf("its own certificate: %v", err)
	}
	if err := handshake(t, srvB, tlsfiles.Pinned(srvA)); err == nil {
		t.Errorf("another certificate was accepted")
	}
}

// A server takes a new pair written over its files, and keeps the one in
// service while the new one does not load.
func TestServerReloads(t *testing.T) {
	tlsfiles.SetReloadCheck(t, 0)
	dir := t.TempDir()
	a, err := tlstest.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := tlsfiles.Server(a.ServerCert, a.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf := func() []byte {
		c, err := srv.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil || c == nil {
			t.Fatalf("GetCertificate: %v", err)
		}
		return c.Certificate[0]
	}
	first := leaf()
	// A certificate written before its key: the old pair stays.
	if err := os.WriteFile(a.ServerCert, []byte("not yet"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(leaf(), first) {
		t.Fatal("a pair that does not load replaced the one in service")
	}
	if _, err := tlstest.Write(dir); err != nil { // a new CA, certificate and key, over the files
		t.Fatal(err)
	}
	if bytes.Equal(leaf(), first) {
		t.Fatal("the new pair was not taken")
	}
	if err := handshake(t, srv, tlsfiles.Pinned(srv)); err != nil {
		t.Errorf("the pinned client after a reload: %v", err)
	}
}

// handshake serves srv on a loopback port and returns the error of a
// client's handshake with cli.
func handshake(t *testing.T, srv, cli *tls.Config) error {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", srv)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.(*tls.Conn).Handshake()
	}()
	defer func() { <-done }()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", ln.Addr().String(), cli)
	if err != nil {
		return err
	}
	return c.Close()
}
