package etcdserver_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/lib/etcdserver"
	"github.com/lanesdev/lanes/internal/testkit/leaktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leaktest.Options()...)
}

func TestStartPersistsAcrossRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "data")

	s, err := etcdserver.Start(ctx, etcdserver.Config{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	eps := s.Endpoints()
	if len(eps) != 1 {
		t.Fatalf("Endpoints() = %v, want one", eps)
	}
	put(t, ctx, eps, "k", "v1")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil { // idempotent
		t.Fatal(err)
	}

	// A fixed client address, as `lanes up` uses, on the same data dir.
	addr := eps[0][len("http://"):]
	s2, err := etcdserver.Start(ctx, etcdserver.Config{Dir: dir, ClientAddr: addr, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if got := s2.Endpoints(); len(got) != 1 || got[0] != eps[0] {
		t.Fatalf("Endpoints() after restart = %v, want %v", got, eps)
	}
	if got := get(t, ctx, s2.Endpoints(), "k"); got != "v1" {
		t.Fatalf("after restart k = %q, want v1", got)
	}
}

func TestStartRejectsBadConfig(t *testing.T) {
	ctx := context.Background()
	if _, err := etcdserver.Start(ctx, etcdserver.Config{}); err == nil {
		t.Fatal("Start without Dir succeeded")
	}
	if _, err := etcdserver.Start(ctx, etcdserver.Config{Dir: t.TempDir(), ClientAddr: "http://127.0.0.1:2379"}); err == nil {
		t.Fatal("Start with a URL as ClientAddr succeeded")
	}
	_, err := etcdserver.Start(ctx, etcdserver.Config{Dir: t.TempDir(), BcryptCost: 3})
	if err == nil || !strings.Contains(err.Error(), "BcryptCost 3") {
		t.Fatalf("Start with BcryptCost 3: %v; want an error naming it", err)
	}
}

func TestStartPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := etcdserver.Start(ctx, etcdserver.Config{Dir: t.TempDir(), ClientAddr: l.Addr().String()})
	if err == nil {
		s.Close()
		t.Fatal("Start on a taken fixed port succeeded")
	}
}

func put(t *testing.T, ctx context.Context, eps []string, k, v string) {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Put(ctx, k, v); err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, ctx context.Context, eps []string, k string) string {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := c.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) == 0 {
		return ""
	}
	return string(r.Kvs[0].Value)
}
