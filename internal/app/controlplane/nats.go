package controlplane

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lanesdev/lanes/internal/lib/natsserver"
)

// natsComponent runs the embedded NATS server with JetStream, for
// message-queue lanes (package lanesnats), or checks that an external one
// answers.
type natsComponent struct {
	rt    *Runtime
	srv   *natsserver.Server
	fatal fatalWatch
}

func (*natsComponent) Name() string    { return "nats" }
func (*natsComponent) Needs() []Dep    { return []Dep{DataDirKey} }
func (*natsComponent) Provides() []Dep { return []Dep{NatsKey} }

func (*natsComponent) Validate(cfg *Config) error { return cfg.validateNats() }

func (c *natsComponent) Provision(ctx context.Context, rt *Runtime) error {
	c.rt = rt
	cfg := rt.Config.Nats
	if cfg.URL != "" {
		return c.external(ctx, cfg.URL)
	}
	if cfg.Addr == NatsOff {
		Provide(rt, NatsKey, NatsInfo{})
		return nil
	}
	dir := filepath.Join(Need(rt, DataDirKey), "nats")
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	srv, err := natsserver.Start(sctx, natsserver.Config{Dir: dir, Addr: cfg.Addr, Logger: rt.Log.With("component", "nats")})
	cancel()
	if err != nil {
		hint := ""
		if errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use") {
			hint = " (a NATS server already runs there? use it with --nats-url, or move this one with --nats-addr; port 0 picks one, off runs none)"
		}
		return fmt.Errorf("embedded NATS on %s (--nats-addr): %w%s", cfg.Addr, err, hint)
	}
	c.srv = srv
	if err := rt.Listening(ctx, "nats", srv.URL()); err != nil {
		return err
	}
	Provide(rt, NatsKey, NatsInfo{URL: srv.URL(), Embedded: true})
	rt.Announce(Address{Name: "nats", URL: srv.URL(), Note: "embedded, JetStream data in " + dir})
	return nil
}

// external checks that the NATS servers at urls answer with JetStream on.
func (c *natsComponent) external(ctx context.Context, urls string) error {
	shown := redactURLs(urls)
	nc, err := nats.Connect(urls, nats.Name("lanes up"), nats.Timeout(5*time.Second), nats.NoReconnect())
	if err != nil {
		return fmt.Errorf("external NATS at %s (--nats-url): %w", shown, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("external NATS at %s: %w", shown, err)
	}
	if err := waitJetStream(ctx, js); err != nil {
		return fmt.Errorf("external NATS at %s: JetStream: %w", shown, err)
	}
	for _, u := range strings.Split(urls, ",") {
		u = strings.TrimSpace(u)
		if !strings.Contains(u, "://") {
			u = "nats://" + u
		}
		if err := c.rt.Listening(ctx, "nats", u); err != nil {
			c.rt.Log.Warn("a NATS server could not be resolved to reserve it from instance addresses", "url", redactURLs(u), "err", err)
		}
	}
	Provide(c.rt, NatsKey, NatsInfo{URL: urls})
	c.rt.Announce(Address{Name: "nats", URL: shown, Note: "external, JetStream on"})
	return nil
}

// jetStreamWait bounds how long start-up waits for an external JetStream
// to answer: a cluster that has just lost its meta leader answers again
// once it has elected another, which may take some seconds.
const jetStreamWait = 30 * time.Second

// waitJetStream waits until JetStream answers an account request, trying
// again (each attempt within 5s) until jetStreamWait passes or ctx ends. A
// server without JetStream is refused at once.
func waitJetStream(ctx context.Context, js jetstream.JetStream) error {
	ctx, cancel := context.WithTimeout(ctx, jetStreamWait)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := js.AccountInfo(actx)
		acancel()
		if err == nil || errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			return err
		}
		t := time.NewTimer(250 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// Start watches the embedded server for a fatal error.
func (c *natsComponent) Start(context.Context) error {
	if c.srv == nil {
		return nil
	}
	c.fatal.start(c.rt, "embedded NATS", c.srv.Err())
	return nil
}

func (c *natsComponent) Stop(context.Context) error {
	c.fatal.stop()
	return nil
}

// Cleanup shuts the embedded server down; it flushes JetStream's data.
func (c *natsComponent) Cleanup() error {
	if c.srv != nil {
		return c.srv.Close()
	}
	return nil
}
