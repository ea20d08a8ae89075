package etcdtest_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/internal/testkit/leaktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leaktest.Options()...)
}

// TestRestartKeepsData checks both kinds of server: a value written before a
// stop (or a kill) is there after the start, on the same endpoints.
func TestRestartKeepsData(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		eps := srv.Endpoints()
		c := etcdtest.Client(t, eps)
		if _, err := c.Put(ctx, "k", "v"); err != nil {
			t.Fatal(err)
		}
		if err := srv.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		if got := srv.Endpoints(); got[0] != eps[0] {
			t.Fatalf("endpoints changed over restart: %v -> %v", eps, got)
		}
		r, err := c.Get(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v" {
			t.Fatalf("after restart: %v", r.Kvs)
		}
	})
}

// TestProcessCPUTime reads the CPU time of a running etcd process, which
// grows as it works, and fails on a stopped one.
func TestProcessCPUTime(t *testing.T) {
	p := etcdtest.Process(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := etcdtest.Client(t, p.Endpoints())
	before, err := p.CPUTime()
	if err != nil {
		t.Fatal(err)
	}
	for {
		for range 100 {
			if _, err := c.Put(ctx, "k", "v"); err != nil {
				t.Fatal(err)
			}
		}
		after, err := p.CPUTime()
		if err != nil {
			t.Fatal(err)
		}
		if after > before {
			break
		}
	}
	p.Stop()
	if _, err := p.CPUTime(); err == nil {
		t.Error("CPUTime of a stopped process: no error")
	}
}
