package lanesnats_test

import (
	"context"
	"log"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesnats"
	"github.com/lanesdev/lanes/routing"
)

// A service publishes order events in the lane of the request it serves,
// and another consumes them: the baseline instance of billing handles
// baseline orders, and an instance started with LANES_LANE=alice handles
// alice's orders (and the baseline handles them while it is not running).
func Example() {
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL) // lanes up runs NATS on 127.0.0.1:4222
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateOrUpdateStream(ctx, lanesnats.StreamConfig("orders")); err != nil {
		log.Fatal(err)
	}
	js.CreateOrUpdateStream(ctx, lanesnats.StreamConfig(lanesnats.DeadLetterTopic("orders")))

	store, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: []string{"127.0.0.1:7701"}})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	engine := routing.New(routing.WithRegistry(store), routing.WithPolicyStore(store.Policy()))
	defer engine.Close()

	// The consumer: its lane comes from LANES_LANE.
	c, err := lanesnats.NewConsumer(ctx, js, lanesnats.ConsumerConfig{
		Service: "billing", Group: "invoices", Topic: "orders",
		Registry: store, Engine: engine,
	}, lanesnats.HandlerFunc(func(ctx context.Context, d *lanesnats.Delivery) error {
		log.Printf("order %s in lane %q (seq %d)", d.Data, lane.FromContext(ctx), d.Seq)
		return nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// The producer: the lane comes from the context, as set by laneshttp
	// or lanesgrpc for the request being served.
	pub, _ := lanesnats.NewPublisher(js, "orders")
	reqCtx := lane.WithLane(ctx, "alice")
	if _, err := pub.Publish(reqCtx, "created", []byte("order-42"), jetstream.WithMsgID("order-42/created")); err != nil {
		log.Fatal(err)
	}
}
