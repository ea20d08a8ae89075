// Package etcdtest gives tests a real etcd: an embedded member in the test
// process (always available) or an etcd server process started from the
// etcd binary on PATH (skipped when there is none). Both can be stopped and
// started again on the same data directory and ports, so that tests can
// check what survives a restart.
//
// Everything a helper starts is stopped by t.Cleanup.
package etcdtest

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/lanesdev/lanes/internal/lib/etcdserver"
	"github.com/lanesdev/lanes/internal/testkit/proctest"
)

// StartTimeout bounds how long a helper waits for etcd to serve clients.
const StartTimeout = 30 * time.Second

// bcryptCost is the cost of the password hashes of the kit's etcds, bcrypt's
// least. At etcd's default (10) each user added and each log-in takes 1 to 5
// seconds in an embedded member of a test binary built with -race on a
// loaded machine: longer than a client's dial timeout, in which it logs in.
const bcryptCost = 4

// Server is an etcd a test runs against.
type Server interface {
	// Kind is "embedded" or "process".
	Kind() string
	// Endpoints are the client URLs.
	Endpoints() []string
	// Stop shuts etcd down cleanly and waits until it has exited.
	Stop() error
	// Kill stops etcd abruptly (SIGKILL for a process; for an embedded
	// member, which cannot be killed without killing the test, it is Stop).
	Kill() error
	// Start starts a stopped etcd again with the same data directory and
	// ports, and waits until it serves clients.
	Start() error
	// Restart is Stop then Start.
	Restart() error
}

// Each runs fn once per kind of etcd server, in subtests named after the
// kind: "embedded" and "process" (skipped when the etcd binary is absent).
// Each subtest gets a fresh, empty server. The two subtests run in parallel
// with each other (most of their time is spent waiting for leases), so fn
// must not share state between calls.
func Each(t *testing.T, fn func(t *testing.T, srv Server)) {
	t.Helper()
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		fn(t, Embedded(t))
	})
	t.Run("process", func(t *testing.T) {
		t.Parallel()
		fn(t, Process(t))
	})
}

// Client returns a client of endpoints that is closed at cleanup. Its own
// logging is silenced; tests assert on behaviour, not on client logs.
func Client(t testing.TB, endpoints []string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// RootPassword is the password of etcd's root user once EnableAuth ran.
const RootPassword = "etcdtest-root"

// EnableAuth turns on the authentication of the etcd that c (a client
// without credentials) reaches: it creates the root user (with
// RootPassword) and user with password, whose role (named user too) may
// read and write the keys under prefix only.
func EnableAuth(ctx context.Context, c *clientv3.Client, user, password, prefix string) error {
	steps := []func() error{
		func() error { _, err := c.RoleAdd(ctx, "root"); return err },
		func() error { _, err := c.UserAdd(ctx, "root", RootPassword); return err },
		func() error { _, err := c.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := c.RoleAdd(ctx, user); return err },
		func() error {
			_, err := c.RoleGrantPermission(ctx, user, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := c.UserAdd(ctx, user, password); return err },
		func() error { _, err := c.UserGrantRole(ctx, user, user); return err },
		func() error { _, err := c.AuthEnable(ctx); return err },
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return fmt.Errorf("etcdtest: enable auth: %w", err)
		}
	}
	return nil
}

// EmbeddedServer is an etcd member running in the test process. Clients
// reach it through a proxy on a fixed loopback port, so that Stop cuts
// their connections at once and Start brings it back on the same endpoint.
// etcd's own ports are new at every start (a single member's peer URL is
// not used): reusing them, a restart could find one taken meanwhile by
// another connection's ephemeral port ("address already in use").
type EmbeddedServer struct {
	t        testing.TB
	dir      string
	endpoint string // the proxy's host:port, fixed by the first Start

	mu    sync.Mutex
	srv   *etcdserver.Server // nil while stopped
	proxy *proxy
}

var _ Server = (*EmbeddedServer)(nil)

// Embedded starts an embedded etcd member with its data in a temporary
// directory. It is closed at cleanup.
func Embedded(t testing.TB) *EmbeddedServer {
	t.Helper()
	e := &EmbeddedServer{t: t, dir: filepath.Join(t.TempDir(), "etcd")}
	if err := e.Start(); err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(func() { e.Stop() })
	return e
}

func (e *EmbeddedServer) Kind() string { return "embedded" }

func (e *EmbeddedServer) Endpoints() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return []string{"http://" + e.endpoint}
}

func (e *EmbeddedServer) Start() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	srv, err := etcdserver.Start(ctx, etcdserver.Config{
		Dir:           e.dir,
		UnsafeNoFsync: true,
		BcryptCost:    bcryptCost,
	})
	if err != nil {
		return err
	}
	listen := e.endpoint
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	p, err := newProxy(listen, strings.TrimPrefix(srv.Endpoints()[0], "http://"))
	if err != nil {
		srv.Close()
		return err
	}
	e.srv, e.proxy, e.endpoint = srv, p, p.addr()
	return nil
}

// Stop cuts the client connections and stops the member.
func (e *EmbeddedServer) Stop() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv == nil {
		return nil
	}
	e.proxy.close()
	err := e.srv.Close()
	e.srv, e.proxy = nil, nil
	return err
}

func (e *EmbeddedServer) Kill() error { return e.Stop() }

func (e *EmbeddedServer) Restart() error {
	if err := e.Stop(); err != nil {
		return err
	}
	return e.Start()
}

// freePort returns a loopback host:port that was free a moment ago.
func freePort() (string, error) { return proctest.FreeAddr() }
