package routedcall_test

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"testing"

	"github.com/lanesdev/lanes/internal/lib/routedcall"
)

// TestUnsent dials a loopback port that nothing listens on: the refusal is an unsent request, as
// is the same error returned through net/http; an error after the dial is not.
func TestUnsent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	_, derr := net.Dial("tcp", addr)
	if derr == nil {
		t.Skip("a closed loopback port accepted a connection")
	}
	if !routedcall.Unsent(derr) {
		t.Errorf("Unsent(%v) = false, want true", derr)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	_, herr := (&http.Client{Transport: tr}).Get("http://" + addr + "/")
	if herr == nil || !routedcall.Unsent(herr) {
		t.Errorf("Unsent(%v) through net/http = false, want true", herr)
	}
	for _, err := range []error{nil, errors.New("boom"), fmt.Errorf("wrapped: %w", &net.OpError{Op: "read", Err: errors.New("reset")})} {
		if routedcall.Unsent(err) {
			t.Errorf("Unsent(%v) = true, want false", err)
		}
	}
}
