package etcdserver_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/lanesdev/lanes/internal/lib/etcdserver"
)

// try puts a key as user (none for ""), and returns the error.
func try(ctx context.Context, eps []string, user, password string) error {
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, Username: user, Password: password, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Put(ctx, "k", "v")
	return err
}

// TestRootPassword: with RootPassword, etcd takes no request without
// credentials, and the root user's work; a restart checks the password; and
// NoAuth turns authentication off again.
func TestRootPassword(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "data")
	cfg := etcdserver.Config{Dir: dir, UnsafeNoFsync: true, BcryptCost: 4, RootPassword: "s3cret-s3cret"}
	s, err := etcdserver.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	eps := s.Endpoints()
	if err := try(ctx, eps, "", ""); err == nil {
		t.Error("a put without credentials succeeded")
	}
	if err := try(ctx, eps, etcdserver.RootUser, "s3cret-s3cret"); err != nil {
		t.Errorf("a put as root: %v", err)
	}
	s.Close()

	addr := strings.TrimPrefix(eps[0], "http://")
	cfg.ClientAddr = addr
	cfg.RootPassword = "wrong-password"
	if s, err := etcdserver.Start(ctx, cfg); err == nil || !strings.Contains(err.Error(), "root password") {
		if s != nil {
			s.Close()
		}
		t.Fatalf("a restart with another password: %v, want an error naming the root password", err)
	}
	cfg.RootPassword = "s3cret-s3cret"
	s, err = etcdserver.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := try(ctx, s.Endpoints(), "", ""); err == nil {
		t.Error("after a restart: a put without credentials succeeded")
	}
	s.Close()

	cfg.NoAuth = true
	s, err = etcdserver.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := try(ctx, s.Endpoints(), "", ""); err != nil {
		t.Errorf("with NoAuth: %v", err)
	}
}
