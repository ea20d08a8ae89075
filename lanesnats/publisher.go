package lanesnats

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/lanesdev/lanes/lane"
)

// MsgIDHeader is the JetStream header that deduplicates publishes.
const MsgIDHeader = jetstream.MsgIDHeader

// A Publisher publishes the messages of one topic in the lane of the
// context: to "<topic>.<lane or _>.<subject>", with the lane in the x-lane
// header and the lane member of the W3C baggage header (a baseline message
// carries neither: stale lane headers are removed), and a Nats-Msg-Id so
// that a retried publish is stored once.
//
// A Publisher is safe for concurrent use.
type Publisher struct {
	js    jetstream.JetStream
	topic string
	prop  lane.Propagator
	noID  bool
}

// PublisherOpt configures NewPublisher.
type PublisherOpt func(*Publisher) error

// WithPropagator sets the propagator that writes the lane headers (default:
// the zero lane.Propagator; its Aliases are removed from baseline messages).
func WithPropagator(p lane.Propagator) PublisherOpt {
	return func(pub *Publisher) error { pub.prop = p; return nil }
}

// WithoutMsgID stops the publisher from setting a Nats-Msg-Id on messages
// that have none. Retried publishes may then be stored twice.
func WithoutMsgID() PublisherOpt {
	return func(pub *Publisher) error { pub.noID = true; return nil }
}

// NewPublisher returns a publisher of topic on js. The stream of the topic
// must exist when messages are published (see StreamConfig).
func NewPublisher(js jetstream.JetStream, topic string, opts ...PublisherOpt) (*Publisher, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: nil JetStream", ErrInvalidOption)
	}
	if err := CheckTopic(topic); err != nil {
		return nil, err
	}
	p := &Publisher{js: js, topic: topic}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(p); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Topic returns the publisher's topic.
func (p *Publisher) Topic() string { return p.topic }

// Publish publishes data with the subject subject within the topic (for
// example "created", or "eu.created"), in the lane of ctx, and waits for
// JetStream's acknowledgement: once it returns without error the message is
// stored (with the stream's replicas and sync settings).
func (p *Publisher) Publish(ctx context.Context, subject string, data []byte, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return p.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data}, opts...)
}

// PublishMsg publishes msg, whose Subject is the subject within the topic,
// in the lane of ctx, and waits for JetStream's acknowledgement. msg is not
// modified: the published message is a copy with the topic's subject and the
// lane headers. A Nats-Msg-Id already in msg's header, or given with
// jetstream.WithMsgID, is kept.
func (p *Publisher) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	out, err := p.stamp(ctx, msg)
	if err != nil {
		return nil, err
	}
	return p.js.PublishMsg(ctx, out, opts...)
}

// PublishMsgAsync is PublishMsg without waiting: the returned future
// delivers JetStream's acknowledgement or error. A message is stored only
// once its future says so; publish again (the Nats-Msg-Id makes that safe)
// when it fails. ctx gives the lane; the wait is bounded by the
// JetStream context's async options, not by ctx.
func (p *Publisher) PublishMsgAsync(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	out, err := p.stamp(ctx, msg)
	if err != nil {
		return nil, err
	}
	return p.js.PublishMsgAsync(out, opts...)
}

// stamp returns the message to publish: a copy of msg on the lane's subject,
// with the lane headers and a message id.
func (p *Publisher) stamp(ctx context.Context, msg *nats.Msg) (*nats.Msg, error) {
	if msg == nil {
		return nil, fmt.Errorf("%w: nil message", ErrInvalidSubject)
	}
	if err := checkSubject(msg.Subject); err != nil {
		return nil, err
	}
	l := normLane(lane.FromContext(ctx))
	h := make(nats.Header, len(msg.Header)+3)
	for k, v := range msg.Header {
		h[k] = v
	}
	p.prop.InjectLane(l, lane.MessageHeader(h))
	if !p.noID && len(h[MsgIDHeader]) == 0 {
		h[MsgIDHeader] = []string{nuid.Next()}
	}
	tok := l
	if tok == "" {
		tok = BaselineToken
	}
	return &nats.Msg{Subject: p.topic + "." + tok + "." + msg.Subject, Header: h, Data: msg.Data}, nil
}
