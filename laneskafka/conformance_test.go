package laneskafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/internal/testkit/mqtest"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneskafka"
	"github.com/lanesdev/lanes/registry"
)

// TestConformance runs the message-queue conformance suite on kfake, or on
// the broker of LANES_TEST_KAFKA.
func TestConformance(t *testing.T) {
	seeds := brokers(t)
	mqtest.Run(t, func(t *testing.T, env mqtest.Env) mqtest.Backend {
		return newKafkaBackend(t, seeds, env)
	})
}

// TestConformanceBroker runs the suite on a real Kafka broker; there is none
// on the test machine, so it skips unless LANES_TEST_KAFKA names one.
func TestConformanceBroker(t *testing.T) {
	seeds := realBrokers(t)
	mqtest.Run(t, func(t *testing.T, env mqtest.Env) mqtest.Backend {
		return newKafkaBackend(t, seeds, env)
	})
}

func newKafkaBackend(t *testing.T, seeds []string, env mqtest.Env) *kafkaBackend {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	pub, err := laneskafka.NewPublisher(cl, env.Topic, laneskafka.WithPublisherTracerProvider(env.TracerProvider))
	if err != nil {
		t.Fatal(err)
	}
	return &kafkaBackend{t: t, seeds: seeds, env: env, pub: pub}
}

type kafkaBackend struct {
	t     *testing.T
	seeds []string
	env   mqtest.Env
	pub   *laneskafka.Publisher
}

func (b *kafkaBackend) Publish(ctx context.Context, id string) error {
	return b.pub.Publish(ctx, nil, []byte(id))
}

func (b *kafkaBackend) Start(ctx context.Context, spec mqtest.Spec, handle mqtest.Handle) (mqtest.Consumer, error) {
	cut := &mqtest.Cutter{}
	opts := append([]kgo.Opt{kgo.SeedBrokers(b.seeds...), kgo.Dialer(cut.DialContext)}, groupOpts()...)
	c, err := laneskafka.NewConsumer(ctx, laneskafka.ConsumerConfig{
		Service: spec.Service, Group: spec.Group, Topic: b.env.Topic, ClientOpts: opts,
		Registry: b.env.Registry, Engine: b.env.Engine, Instance: registry.Instance{ID: spec.ID, Lane: spec.Lane},
	}, laneskafka.HandlerFunc(func(ctx context.Context, d *laneskafka.Delivery) error {
		h := map[string][]string{}
		for _, rh := range d.Headers {
			h[rh.Key] = append(h[rh.Key], string(rh.Value))
		}
		handle(ctx, mqtest.Handled{ID: string(d.Value), Lane: d.Lane, CtxLane: lane.FromContext(ctx), Header: h,
			TraceID: trace.SpanContextFromContext(ctx).TraceID()})
		return ctx.Err()
	}), testOpts(laneskafka.WithConsumerTracerProvider(b.env.TracerProvider))...)
	if err != nil {
		return nil, err
	}
	return &kafkaConsumer{c: c, cut: cut}, nil
}

type kafkaConsumer struct {
	c   *laneskafka.Consumer
	cut *mqtest.Cutter
}

func (c *kafkaConsumer) Stop() error { return c.c.Close() }

// Kill cuts the consumer's connections, then stops it without a commit or
// a goodbye: its groups notice after their session timeout.
func (c *kafkaConsumer) Kill() {
	c.cut.Cut()
	c.c.Abort()
}

// testOpts are fast settings for tests.
func testOpts(extra ...laneskafka.ConsumerOpt) []laneskafka.ConsumerOpt {
	return append([]laneskafka.ConsumerOpt{
		laneskafka.WithLogger(quiet()),
		laneskafka.WithEnv(func(string) string { return "" }),
		laneskafka.WithDiscoveryInterval(100 * time.Millisecond),
		laneskafka.WithRetryDelays(10 * time.Millisecond),
		laneskafka.WithDrainTimeout(5 * time.Second),
	}, extra...)
}

func (c *kafkaConsumer) Owned() []string { return c.c.Owned() }
