// Package natstest gives tests a real NATS server with JetStream: an
// embedded server in the test process (always available) or a nats-server
// process started from the binary (skipped when there is none). Both can be
// stopped and started again on the same store directory and port, so that
// tests can check what survives a restart; the process can also be killed
// with SIGKILL.
//
// Everything a helper starts is stopped by t.Cleanup.
package natstest

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lanesdev/lanes/internal/lib/natsserver"
)

// StartTimeout bounds how long a helper waits for NATS to accept clients.
const StartTimeout = 30 * time.Second

// Server is a NATS server a test runs against.
type Server interface {
	// Kind is "embedded" or "process".
	Kind() string
	// URL is the client URL, nats://127.0.0.1:port; it does not change
	// over restarts.
	URL() string
	// Stop shuts NATS down cleanly and waits until it has exited.
	Stop() error
	// Kill stops NATS abruptly (SIGKILL for a process; for an embedded
	// server, which cannot be killed without killing the test, it is Stop).
	Kill() error
	// Start starts a stopped server again with the same store directory
	// and port, and waits until it accepts clients.
	Start() error
	// Restart is Stop then Start.
	Restart() error
}

// Each runs fn once per kind of server, in subtests named after the kind:
// "embedded" and "process" (skipped with SkipMessage when the nats-server
// binary is absent). Each subtest gets a fresh, empty server. The subtests
// run one after the other.
func Each(t *testing.T, fn func(t *testing.T, srv Server)) {
	t.Helper()
	t.Run("embedded", func(t *testing.T) { fn(t, Embedded(t)) })
	t.Run("process", func(t *testing.T) { fn(t, Process(t)) })
}

// Connect returns a connection to url (one URL, or a cluster's
// comma-separated list) that is closed at cleanup, and its JetStream
// context. The connection reconnects for ever, so that it survives a restart
// of the server, and pings every second, so that it leaves a paused server
// within seconds.
func Connect(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond),
		nats.PingInterval(time.Second), nats.MaxPingsOutstanding(2)}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("natstest: connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	return nc, js
}

// EmbeddedServer is a NATS server running in the test process.
type EmbeddedServer struct {
	t   testing.TB
	dir string

	mu   sync.Mutex
	srv  *natsserver.Server // nil while stopped
	addr string             // fixed by the first Start
}

var _ Server = (*EmbeddedServer)(nil)

// Embedded starts an embedded NATS server with JetStream, its store in a
// temporary directory, on a free loopback port. It is closed at cleanup.
func Embedded(t testing.TB) *EmbeddedServer {
	t.Helper()
	e := &EmbeddedServer{t: t, dir: filepath.Join(t.TempDir(), "nats")}
	if err := e.Start(); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	t.Cleanup(func() { e.Stop() })
	return e
}

func (e *EmbeddedServer) Kind() string { return "embedded" }

func (e *EmbeddedServer) URL() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return "nats://" + e.addr
}

func (e *EmbeddedServer) Start() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	srv, err := natsserver.Start(ctx, natsserver.Config{
		Dir:    e.dir,
		Addr:   e.addr,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return err
	}
	e.srv, e.addr = srv, srv.Addr()
	return nil
}

// Stop shuts the server down; clients see their connection close.
func (e *EmbeddedServer) Stop() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv == nil {
		return nil
	}
	err := e.srv.Close()
	e.srv = nil
	return err
}

func (e *EmbeddedServer) Kill() error { return e.Stop() }

func (e *EmbeddedServer) Restart() error {
	if err := e.Stop(); err != nil {
		return err
	}
	return e.Start()
}
