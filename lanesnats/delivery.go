package lanesnats

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A Handler handles the messages a Consumer delivers. ctx carries the lane of
// the message (lane.FromContext), so the calls and publishes the handler
// makes with it stay in that lane; it is cancelled only when the consumer
// gives up waiting for the handler (WithDrainTimeout).
//
// Returning nil acknowledges the message. Returning an error delivers it
// again after a delay (WithRetryDelays), until the delivery WithMaxDeliver
// fails too; it then goes to the dead-letter topic. An error wrapped with
// Permanent sends it there at once.
//
// A message may be delivered again after a consumer crashed while holding
// it (within the hand-off window, see docs/mq.md): deduplicate on
// Delivery.Seq when handling twice matters.
type Handler interface {
	HandleMessage(ctx context.Context, d *Delivery) error
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, d *Delivery) error

// HandleMessage calls f(ctx, d).
func (f HandlerFunc) HandleMessage(ctx context.Context, d *Delivery) error { return f(ctx, d) }

// Delivery is one delivery of a message to a handler.
type Delivery struct {
	// Lane is the lane of the message, "" for the baseline: the lane it was
	// published in (its subject's lane token), or the baseline for a token
	// that is not a valid lane name. It is also the lane of the handler's
	// context.
	Lane string
	// Subject is the subject within the topic, such as "created".
	Subject string
	// Data and Header are the message's payload and headers.
	Data   []byte
	Header nats.Header
	// Seq is the message's sequence in the stream: the same on every
	// delivery of the message and unique in the stream, the id to
	// deduplicate on.
	Seq uint64
	// MsgID is the producer's Nats-Msg-Id ("" when there is none).
	MsgID string
	// NumDelivered counts the deliveries of the message to the group, this
	// one included: above 1, an earlier delivery failed or its holder died.
	NumDelivered uint64
	// Msg is the message as received; Msg.Metadata() has its JetStream
	// metadata. Do not acknowledge it: the Consumer does, from the
	// handler's result.
	Msg jetstream.Msg
}
