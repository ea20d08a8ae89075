package lanesnats_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/nats-io/nats.go"

	"github.com/lanesdev/lanes/internal/testkit/mqtest"
	"github.com/lanesdev/lanes/internal/testkit/natstest"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesnats"
	"github.com/lanesdev/lanes/registry"
)

// TestConformance runs the message-queue conformance suite on an embedded
// NATS server.
func TestConformance(t *testing.T) {
	srv := natstest.Embedded(t)
	mqtest.Run(t, func(t *testing.T, env mqtest.Env) mqtest.Backend {
		_, js := natstest.Connect(t, srv.URL())
		b := &natsBackend{t: t, env: env, url: srv.URL()}
		for _, topic := range []string{env.Topic, lanesnats.DeadLetterTopic(env.Topic)} {
			if _, err := js.CreateOrUpdateStream(context.Background(), lanesnats.StreamConfig(topic)); err != nil {
				t.Fatal(err)
			}
		}
		var err error
		if b.pub, err = lanesnats.NewPublisher(js, env.Topic, lanesnats.WithPublisherTracerProvider(env.TracerProvider)); err != nil {
			t.Fatal(err)
		}
		return b
	})
}

// natsBackend is the suite's backend on NATS: each consumer has its own
// connection, which Kill closes.
type natsBackend struct {
	t   *testing.T
	env mqtest.Env
	url string
	pub *lanesnats.Publisher
}

func (b *natsBackend) Publish(ctx context.Context, id string) error {
	_, err := b.pub.Publish(ctx, "created", []byte(id))
	return err
}

func (b *natsBackend) Start(ctx context.Context, spec mqtest.Spec, handle mqtest.Handle) (mqtest.Consumer, error) {
	nc, js := natstest.Connect(b.t, b.url, nats.MaxReconnects(0))
	c, err := lanesnats.NewConsumer(ctx, js, lanesnats.ConsumerConfig{
		Service: spec.Service, Group: spec.Group, Topic: b.env.Topic, Registry: b.env.Registry, Engine: b.env.Engine,
		Instance: registry.Instance{ID: spec.ID, Lane: spec.Lane},
	}, lanesnats.HandlerFunc(func(ctx context.Context, d *lanesnats.Delivery) error {
		handle(ctx, mqtest.Handled{ID: string(d.Data), Lane: d.Lane, CtxLane: lane.FromContext(ctx),
			Header: d.Header, TraceID: trace.SpanContextFromContext(ctx).TraceID()})
		return ctx.Err()
	}), testOpts(lanesnats.WithConsumerTracerProvider(b.env.TracerProvider), lanesnats.WithAckWait(time.Second),
		lanesnats.WithDrainTimeout(time.Second))...)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &natsConsumer{c: c, nc: nc}, nil
}

type natsConsumer struct {
	c  *lanesnats.Consumer
	nc *nats.Conn
}

func (c *natsConsumer) Stop() error {
	defer c.nc.Close()
	return c.c.Close()
}

// Kill closes the connection first: nothing held is acknowledged; JetStream
// delivers it again after AckWait.
func (c *natsConsumer) Kill() {
	c.nc.Close()
	c.c.Close()
}

func (c *natsConsumer) Owned() []string { return c.c.Owned() }
