// Package lanesnats carries lanes over NATS JetStream: a message published
// in a lane is handled by the consumers of that lane, or of the lane its
// fallback chain reaches, or by the baseline when no consumer serves it;
// baseline messages never reach a lane consumer. The handler's context
// carries the message's lane, so what the handler calls and publishes stays
// in the lane. No message is lost when consumers come, go or crash, and a
// message is handled twice only when a consumer crashed while holding it,
// within a bounded window, or when a NATS server died.
//
// # Publishing
//
// A [Publisher] publishes a topic's messages in the lane of the context, to
// "<topic>.<lane or _>.<subject>", with the lane in the x-lane and baggage
// headers:
//
//	js, _ := jetstream.New(nc)
//	js.CreateOrUpdateStream(ctx, lanesnats.StreamConfig("orders")) // once
//	pub, _ := lanesnats.NewPublisher(js, "orders")
//	ack, err := pub.Publish(ctx, "created", data, jetstream.WithMsgID(orderID))
//
// # Consuming
//
// A [Consumer] is one instance of a consumer group of a service. It
// registers in the registry, under the service "mq.<service>.<group>", in
// its lane (LANES_LANE or the configuration), and asks the routing engine,
// as a caller asks for a call, which lanes it serves:
//
//	engine := routing.New(routing.WithRegistry(store), routing.WithPolicyStore(store.Policy()))
//	c, err := lanesnats.NewConsumer(ctx, js, lanesnats.ConsumerConfig{
//		Service: "billing", Group: "invoices", Topic: "orders",
//		Registry: store, Engine: engine,
//	}, lanesnats.HandlerFunc(func(ctx context.Context, d *lanesnats.Delivery) error {
//		// lane.FromContext(ctx) == d.Lane; d.Seq identifies the message
//		return bill(ctx, d.Data)
//	}))
//	defer c.Close()
//
// Each lane of a topic has one durable JetStream consumer per group
// ("<group>_<lane>", "<group>__" for the baseline); the consumers that own a lane pull from it, and
// ownership moves with the registry and the policy while the durable's
// cursor stays put, which is why a hand-off neither loses nor repeats
// messages. A handler error delivers the message again after a delay; the
// last allowed failure sends it to the dead-letter topic
// ([DeadLetterTopic]), in its lane.
//
// docs/mq.md describes the mechanism, the hand-off and discovery bounds,
// the durability settings and the options.
package lanesnats
