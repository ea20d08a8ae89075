package lanesamqp_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/internal/testkit/amqptest"
	"github.com/lanesdev/lanes/internal/testkit/mqtest"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesamqp"
	"github.com/lanesdev/lanes/registry"
)

// TestConformance runs the message-queue conformance suite on a
// rabbitmq-server process.
func TestConformance(t *testing.T) {
	b := amqptest.Start(t)
	mqtest.Run(t, func(t *testing.T, env mqtest.Env) mqtest.Backend {
		return newAMQPBackend(t, b.URL(), env)
	})
}

func newAMQPBackend(t *testing.T, url string, env mqtest.Env) *amqpBackend {
	pub, err := lanesamqp.NewPublisher(dialer(url, nil), env.Topic, lanesamqp.WithPublisherTracerProvider(env.TracerProvider))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return &amqpBackend{url: url, env: env, pub: pub}
}

type amqpBackend struct {
	url string
	env mqtest.Env
	pub *lanesamqp.Publisher
}

func (b *amqpBackend) Publish(ctx context.Context, id string) error {
	return b.pub.Publish(ctx, "created", []byte(id))
}

func (b *amqpBackend) Start(ctx context.Context, spec mqtest.Spec, handle mqtest.Handle) (mqtest.Consumer, error) {
	cut := &mqtest.Cutter{}
	c, err := lanesamqp.NewConsumer(ctx, lanesamqp.ConsumerConfig{
		Service: spec.Service, Group: spec.Group, Topic: b.env.Topic, Dial: dialer(b.url, cut), Addr: lanesamqp.BrokerAddr(b.url),
		Registry: b.env.Registry, Engine: b.env.Engine, Instance: registry.Instance{ID: spec.ID, Lane: spec.Lane},
	}, lanesamqp.HandlerFunc(func(ctx context.Context, d *lanesamqp.Delivery) error {
		h := map[string][]string{}
		for k, v := range d.Headers {
			if s, ok := v.(string); ok {
				h[k] = []string{s}
			}
		}
		handle(ctx, mqtest.Handled{ID: string(d.Body), Lane: d.Lane, CtxLane: lane.FromContext(ctx), Header: h,
			TraceID: trace.SpanContextFromContext(ctx).TraceID()})
		return ctx.Err()
	}), testOpts(lanesamqp.WithConsumerTracerProvider(b.env.TracerProvider))...)
	if err != nil {
		return nil, err
	}
	return &amqpConsumer{c: c, cut: cut}, nil
}

type amqpConsumer struct {
	c   *lanesamqp.Consumer
	cut *mqtest.Cutter
}

func (c *amqpConsumer) Stop() error { return c.c.Close() }

// Kill cuts the consumer's connections: the broker gives back what it held.
func (c *amqpConsumer) Kill() {
	c.cut.Cut()
	c.c.Abort()
}

func (c *amqpConsumer) Owned() []string { return c.c.Owned() }
