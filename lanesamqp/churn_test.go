package lanesamqp_test

import (
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/amqptest"
	"github.com/lanesdev/lanes/internal/testkit/mqtest"
)

// TestChurn publishes 20,000 messages (2,000 under -short) across the
// baseline and three lanes on a rabbitmq-server process while the lanes'
// consumers are started, stopped and killed (their connections cut), and
// the broker is killed with SIGKILL 4s in and started again; it checks that
// none is lost (mqtest.Churn).
func TestChurn(t *testing.T) {
	b := amqptest.Start(t)
	cfg := mqtest.ChurnConfig{PerLane: 5000, Publish: 15 * time.Second, Seed: 1}
	if testing.Short() {
		cfg.PerLane, cfg.Publish = 500, 5*time.Second
	}
	var restart time.Duration
	cfg.Fault = func(t *testing.T, stop <-chan struct{}) {
		select {
		case <-stop:
			return
		case <-time.After(4 * time.Second):
		}
		began := time.Now()
		if err := b.Kill(); err != nil {
			t.Errorf("kill the broker: %v", err)
			return
		}
		if err := b.Start(); err != nil {
			t.Errorf("start the broker again: %v", err)
			return
		}
		restart = time.Since(began)
	}
	res := mqtest.Churn(t, func(t *testing.T, env mqtest.Env) mqtest.Backend {
		return newAMQPBackend(t, b.URL(), env)
	}, cfg)
	t.Logf("rabbitmq: %v; broker killed and back after %v", res, restart.Round(time.Millisecond))
}
