package laneskafka_test

import (
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/mqtest"
)

// TestChurn publishes 20,000 messages (2,000 under -short) across the
// baseline and three lanes on kfake while the lanes' consumers are started,
// stopped and killed (their connections cut, no commit, no goodbye to the
// group), and checks that none is lost (mqtest.Churn).
func TestChurn(t *testing.T) {
	seeds := brokers(t)
	cfg := mqtest.ChurnConfig{PerLane: 5000, Publish: 15 * time.Second, Seed: 1}
	if testing.Short() {
		cfg.PerLane, cfg.Publish = 500, 5*time.Second
	}
	res := mqtest.Churn(t, func(t *testing.T, env mqtest.Env) mqtest.Backend {
		return newKafkaBackend(t, seeds, env)
	}, cfg)
	t.Logf("kafka (%s): %v", brokerKind(), res)
}
