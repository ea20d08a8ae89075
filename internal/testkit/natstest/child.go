package natstest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/lanesdev/lanes/internal/lib/natsserver"
)

// childEnv carries the configuration of an embedded server run as a child
// process of the test binary (see RunChild).
const childEnv = "LANES_NATSTEST_CHILD"

// RunChild runs an embedded NATS server and exits, when the test binary was
// started as one by EmbeddedProcess or a Cluster of embedded members; it
// returns otherwise. Call it first in TestMain of every package that uses
// them:
//
//	func TestMain(m *testing.M) {
//		natstest.RunChild()
//		goleak.VerifyTestMain(m)
//	}
//
// An embedded server in its own process can be killed with SIGKILL and
// paused with SIGSTOP, as a nats-server process can; one inside the test
// process cannot.
func RunChild() {
	v := os.Getenv(childEnv)
	if v == "" {
		return
	}
	var cfg natsserver.Config
	if err := json.Unmarshal([]byte(v), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "natstest child: %s: %v\n", childEnv, err)
		os.Exit(2)
	}
	level := slog.LevelWarn
	if os.Getenv("LANES_NATSTEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	srv, err := natsserver.Start(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "natstest child: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "natstest child: serving %s\n", srv.URL())
	select {
	case <-ctx.Done():
	case err := <-srv.Err():
		fmt.Fprintf(os.Stderr, "natstest child: %v\n", err)
	}
	srv.Close()
	os.Exit(0)
}

// childEnvOf is the environment of a child process that runs an embedded
// server with cfg.
func childEnvOf(cfg natsserver.Config) ([]string, error) {
	cfg.Logger = nil
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	return append(os.Environ(), childEnv+"="+string(b)), nil
}
