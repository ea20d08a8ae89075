package etcdtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestHealthFromAnotherProcess: a member whose client port another process
// answers on (it took the port first) is not taken as started: the start
// fails once the member has exited.
func TestHealthFromAnotherProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs /proc")
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `{"health":"true","reason":""}`)
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(lis)
	defer srv.Close()
	hc := &http.Client{Timeout: time.Second} //lanes:ignore the health probe of an etcd process, outside lanes
	defer hc.CloseIdleConnections()
	addr := lis.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The test process serves the port: healthy.
	if err := waitHealthy(ctx, hc, os.Getpid(), addr, "http://"+addr, nil); err != nil {
		t.Fatalf("the process that listens: %v", err)
	}

	// A child that does not: not healthy, and an error once it exits.
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Skipf("no sleep command: %v", err)
	}
	exited := make(chan struct{})
	go func() { child.Wait(); close(exited) }()
	res := make(chan error, 1)
	go func() { res <- waitHealthy(ctx, hc, child.Process.Pid, addr, "http://"+addr, exited) }()
	child.Process.Kill()
	if err := <-res; err == nil || !strings.Contains(err.Error(), "another process answers") {
		t.Fatalf("a child that does not listen: %v, want an error saying another process answers", err)
	}
}
