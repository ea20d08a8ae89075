package natsserver

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestRestartKeepsStreams: a stream and its messages survive a Close and a
// Start on the same directory; Close waits for every goroutine.
func TestRestartKeepsStreams(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nats")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Start(ctx, Config{Dir: dir, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s.URL(), "nats://127.0.0.1:") || strings.HasSuffix(s.URL(), ":-1") {
		t.Errorf("URL %q", s.URL())
	}
	addr := s.Addr()
	nc, err := nats.Connect(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.a", []byte("one")); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	s.Close()
	s.Close() // twice is fine

	s, err = Start(ctx, Config{Dir: dir, Addr: addr, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Addr() != addr {
		t.Errorf("restarted on %s, want %s", s.Addr(), addr)
	}
	nc, err = nats.Connect(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ = jetstream.New(nc)
	st, err := js.Stream(ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("%d messages after restart, want 1", n)
	}
}

// TestAddrInUse: a taken port fails the start with an error, at once.
func TestAddrInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	s, err := Start(ctx, Config{Dir: t.TempDir(), Addr: ln.Addr().String(), Logger: quiet})
	if err == nil {
		s.Close()
		t.Fatal("started on a port in use")
	}
	if time.Since(start) > 10*time.Second || ctx.Err() != nil {
		t.Errorf("took %v: %v", time.Since(start), err)
	}
	if _, err := Start(ctx, Config{Logger: quiet}); err == nil {
		t.Error("no Dir accepted")
	}
	if _, err := Start(ctx, Config{Dir: t.TempDir(), Addr: "nats://x:1"}); err == nil {
		t.Error("URL accepted as an address")
	}
}
