package lanesamqp_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/testkit/leaktest"
	"github.com/lanesdev/lanes/lanesamqp"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leaktest.Options()...)
}

// quiet is the logger of the tests; LANESAMQP_DEBUG=1 shows the consumers'
// logs.
func quiet() *slog.Logger {
	if os.Getenv("LANESAMQP_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// cutter dials connections that it can cut all at once, as a crash cuts
// them, and refuses to dial after that.
type cutter struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

func (c *cutter) dial(network, addr string) (net.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut {
		return nil, net.ErrClosed
	}
	conn, err := net.DialTimeout(network, addr, 5*time.Second)
	if err == nil {
		c.conns = append(c.conns, conn)
	}
	return conn, err
}

func (c *cutter) cutAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut = true
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = nil
}

// dialer returns the Dialer of url through cut.
func dialer(url string, cut *cutter) lanesamqp.Dialer {
	cfg := amqp.Config{Heartbeat: 2 * time.Second}
	if cut != nil {
		cfg.Dial = cut.dial
	}
	return lanesamqp.DialURL(url, cfg)
}

// testOpts are fast settings for tests.
func testOpts(extra ...lanesamqp.ConsumerOpt) []lanesamqp.ConsumerOpt {
	return append([]lanesamqp.ConsumerOpt{
		lanesamqp.WithLogger(quiet()),
		lanesamqp.WithEnv(func(string) string { return "" }),
		lanesamqp.WithDiscoveryInterval(100 * time.Millisecond),
		lanesamqp.WithRetryDelays(10 * time.Millisecond),
		lanesamqp.WithDrainTimeout(5 * time.Second),
	}, extra...)
}

var _ = context.Background
