package lanesamqp_test

import (
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/testkit/leaktest"
	"github.com/lanesdev/lanes/internal/testkit/mqtest"
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

// dialer returns the Dialer of url through cut.
func dialer(url string, cut *mqtest.Cutter) lanesamqp.Dialer {
	cfg := amqp.Config{Heartbeat: 2 * time.Second}
	if cut != nil {
		cfg.Dial = cut.Dial
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
