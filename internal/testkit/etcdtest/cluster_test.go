package etcdtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
)

// TestCluster drives a three-member cluster through the kit's faults: the
// leader killed and restarted, a member paused and resumed; the cluster
// keeps its data and elects a leader after each.
func TestCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := etcdtest.NewCluster(t, etcdtest.ClusterConfig{})
	cl := c.Client(t)
	if _, err := cl.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := leader.Kill(); err != nil {
		t.Fatal(err)
	}
	next, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if next == leader {
		t.Fatalf("killed %s still leads", leader.Name)
	}
	if _, err := cl.Put(ctx, "k", "v2"); err != nil {
		t.Fatalf("put with two of three members: %v", err)
	}
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	if err := next.Pause(); err != nil {
		t.Fatal(err)
	}
	third, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if third == next {
		t.Fatalf("paused %s still leads", next.Name)
	}
	if err := next.Resume(); err != nil {
		t.Fatal(err)
	}
	r, err := cl.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v2" {
		t.Fatalf("after the faults: %v", r.Kvs)
	}
}

// TestClusterTLSAuth starts a cluster that serves clients over TLS with
// client certificates, and turns authentication on.
func TestClusterTLSAuth(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := etcdtest.NewCluster(t, etcdtest.ClusterConfig{TLS: true})
	if err := c.EnableAuth(ctx, "lanes", "lanes-secret", "/lanes/"); err != nil {
		t.Fatal(err)
	}
	cl := c.Client(t)
	if _, err := cl.Put(ctx, "/lanes/k", "v"); err != nil {
		t.Fatalf("put in the prefix: %v", err)
	}
	if _, err := cl.Put(ctx, "/other", "v"); err == nil {
		t.Fatal("put outside the prefix succeeded; want permission denied")
	}
	if _, err := c.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
}
