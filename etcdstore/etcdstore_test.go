package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/internal/testkit/leaktest"
	"github.com/lanesdev/lanes/internal/testkit/registrytest"
	"github.com/lanesdev/lanes/internal/testkit/timing"
	"github.com/lanesdev/lanes/registry"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		// The child of TestLeaseExpiresWhenProcessKilled is killed, not
		// ended; there is nothing to check for leaks.
		os.Exit(m.Run())
	}
	// Make idle watches check that they are alive every half second, so
	// that every test exercises that path (5s in production).
	etcdstore.SetProgressTimes(500*time.Millisecond, 2*time.Second)
	// The parallel tests (the cluster's faults) wait out TTLs, elections
	// and pauses of etcd processes; at one per CPU they took two minutes.
	timing.WaitingTests(4)
	goleak.VerifyTestMain(m, leaktest.Options()...)
}

// testLogger logs the stores' diagnostics at warn and above, to stderr, so
// that a failing run shows them.
var testLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

var prefixes atomic.Int64

// uniquePrefix returns a key prefix no other test in this process uses, so
// that tests can share one etcd.
func uniquePrefix() string { return fmt.Sprintf("/lanes-test-%d/", prefixes.Add(1)) }

// open returns a Store opened on srv's endpoints with a fresh prefix; it is
// closed at cleanup.
func open(t *testing.T, srv etcdtest.Server) *etcdstore.Store {
	t.Helper()
	return openPrefix(t, srv, uniquePrefix())
}

func openPrefix(t *testing.T, srv etcdtest.Server, prefix string) *etcdstore.Store {
	t.Helper()
	s, err := etcdstore.Open(testCtx(t), etcdstore.Config{
		Endpoints: srv.Endpoints(),
		Options:   etcdstore.Options{Prefix: prefix, Logger: testLogger},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// watchStore starts a watch of service on s; it is closed at cleanup.
func watchStore(t *testing.T, s *etcdstore.Store, service string) registry.Watcher {
	t.Helper()
	w, err := s.Watch(testCtx(t), service)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func testCtx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func inst(service, id string, port int) registry.Instance {
	return registry.Instance{Service: service, ID: id, Addr: fmt.Sprintf("10.1.0.1:%d", port)}
}

// TestConformance runs the registry conformance suite on etcd: one server
// per kind, one Store with its own prefix per subtest.
func TestConformance(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		c := etcdtest.Client(t, srv.Endpoints())
		registrytest.Run(t, func(t *testing.T) registry.Registry {
			s, err := etcdstore.New(c, etcdstore.Options{Prefix: uniquePrefix(), Logger: testLogger})
			if err != nil {
				t.Fatal(err)
			}
			return s
		})
	})
}

func TestOpen(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		s := openPrefix(t, srv, "/no-slash")
		if s.Prefix() != "/no-slash/" {
			t.Fatalf("Prefix() = %q, want a trailing slash added", s.Prefix())
		}
		l, err := s.Register(testCtx(t), inst("orders", "a", 1), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		r, err := s.Client().Get(testCtx(t), "/no-slash/instances/orders/a")
		if err != nil || len(r.Kvs) != 1 || r.Kvs[0].Lease == 0 {
			t.Fatalf("instance key: %v, %v; want one key with a lease", r, err)
		}

		d, err := etcdstore.New(s.Client(), etcdstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if d.Prefix() != etcdstore.DefaultPrefix {
			t.Fatalf("default prefix %q", d.Prefix())
		}
		d.Close()
		// New does not own the client: it still works.
		if _, err := s.Client().Get(testCtx(t), "x"); err != nil {
			t.Fatalf("client unusable after closing a Store that wraps it: %v", err)
		}
	})
}

func TestOpenFails(t *testing.T) {
	if _, err := etcdstore.Open(context.Background(), etcdstore.Config{}); err == nil {
		t.Fatal("Open without endpoints succeeded")
	}
	if _, err := etcdstore.New(nil, etcdstore.Options{}); err == nil {
		t.Fatal("New(nil) succeeded")
	}
	// Nothing listens there (the port was free a moment ago).
	start := time.Now()
	_, err := etcdstore.Open(context.Background(), etcdstore.Config{
		Endpoints:   []string{"http://127.0.0.1:1"},
		DialTimeout: 500 * time.Millisecond,
	})
	if err == nil {
		t.Fatal("Open of an unreachable endpoint succeeded")
	}
	if d := time.Since(start); d > timing.Bound(5*time.Second) {
		t.Fatalf("Open took %v to fail, want about its DialTimeout", d)
	}
}

// enableAuth turns etcd's authentication on, with the users root
// (etcdtest.RootPassword) and lanes (password s3cret, read and write on
// /lanes/).
func enableAuth(t *testing.T, srv etcdtest.Server) {
	t.Helper()
	if err := etcdtest.EnableAuth(testCtx(t), etcdtest.Client(t, srv.Endpoints()), "lanes", "s3cret", "/lanes/"); err != nil {
		t.Fatal(err)
	}
}

// openAuth opens a Store as the user lanes of enableAuth.
func openAuth(t *testing.T, srv etcdtest.Server) *etcdstore.Store {
	t.Helper()
	s, err := etcdstore.Open(testCtx(t), etcdstore.Config{Endpoints: srv.Endpoints(), Username: "lanes", Password: "s3cret", Options: etcdstore.Options{Logger: testLogger}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestOpenWithAuth opens a Store with a username and password on an etcd
// with authentication enabled, and checks that a wrong password is refused.
func TestOpenWithAuth(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		ctx := testCtx(t)
		enableAuth(t, srv)
		s := openAuth(t, srv)
		l, err := s.Register(ctx, inst("orders", "a", 1), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Policy().Put(ctx, []byte("lanes: {}\n")); err != nil {
			t.Fatal(err)
		}
		bad, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: srv.Endpoints(), Username: "lanes", Password: "wrong", DialTimeout: 2 * time.Second})
		if err == nil {
			bad.Close()
			t.Fatal("Open with a wrong password succeeded")
		}
		if !errors.Is(err, rpctypes.ErrAuthFailed) {
			t.Fatalf("Open with a wrong password: %v; want %v", err, rpctypes.ErrAuthFailed)
		}
		// Outside its prefix the user has no rights: Open reads
		// <prefix>policy to report that early.
		other, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: srv.Endpoints(), Username: "lanes", Password: "s3cret", DialTimeout: 2 * time.Second, Options: etcdstore.Options{Prefix: "/elsewhere/"}})
		if err == nil {
			other.Close()
			t.Fatal("Open on a prefix the user may not read succeeded")
		}
		if !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Fatalf("Open on a prefix the user may not read: %v; want %v", err, rpctypes.ErrPermissionDenied)
		}
	})
}

// TestLogInAgain revokes the tokens of the Store's user (its password is
// set again) and checks that the Store's requests go on: the etcd client
// logs in again, on a connection without the revoked token (an etcd 3.4
// member refuses a log-in that carries it).
func TestLogInAgain(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		ctx := testCtx(t)
		enableAuth(t, srv)
		s := openAuth(t, srv)
		// The log-in goes on a checked member's connection once a check
		// has answered.
		waitFor(t, "a member check", func() bool {
			h, _ := s.Health()
			return h.State == etcdstore.HealthOK
		})
		root, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints(), DialTimeout: 5 * time.Second, Username: "root", Password: etcdtest.RootPassword, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		for round := range 2 {
			if _, err := root.UserChangePassword(ctx, "lanes", "s3cret"); err != nil {
				t.Fatal(err)
			}
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := s.Policy().Put(rctx, []byte("lanes: {}\n"))
			cancel()
			if err != nil {
				t.Fatalf("round %d: a write after the user's tokens were revoked: %v", round, err)
			}
			l, err := s.Register(ctx, inst("orders", "a", 1), 5*time.Second)
			if err != nil {
				t.Fatalf("round %d: a registration after the user's tokens were revoked: %v", round, err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestRegisterTTL(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		s := open(t, srv)
		ctx := testCtx(t)
		for _, ttl := range []time.Duration{-time.Second, time.Nanosecond, 999 * time.Millisecond} {
			_, err := s.Register(ctx, inst("orders", "a", 1), ttl)
			var fe *registry.FieldError
			if !errors.As(err, &fe) || fe.Field != "ttl" {
				t.Fatalf("Register with ttl %v = %v, want a FieldError on ttl", ttl, err)
			}
		}
		for _, c := range []struct {
			ttl  time.Duration
			want int64
		}{{0, int64(registry.DefaultTTL / time.Second)}, {2500 * time.Millisecond, 3}, {7 * time.Second, 7}} {
			l, err := s.Register(ctx, inst("orders", "a", 1), c.ttl)
			if err != nil {
				t.Fatal(err)
			}
			r, err := s.Client().Get(ctx, s.Prefix()+"instances/orders/a")
			if err != nil || len(r.Kvs) != 1 {
				t.Fatalf("get: %v %v", r, err)
			}
			ttl, err := s.Client().TimeToLive(ctx, clientv3.LeaseID(r.Kvs[0].Lease))
			if err != nil {
				t.Fatal(err)
			}
			if ttl.GrantedTTL != c.want {
				t.Fatalf("ttl %v granted %ds, want %ds", c.ttl, ttl.GrantedTTL, c.want)
			}
			l.Close()
		}
	})
}
