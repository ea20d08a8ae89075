package lanesnats

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/lanesdev/lanes/internal/lib/mqlane"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanestrace"
)

// MsgIDHeader is the JetStream header that deduplicates publishes.
const MsgIDHeader = jetstream.MsgIDHeader

// A Publisher publishes the messages of one topic in the lane of the
// context: to "<topic>.<lane or _>.<subject>", with the lane in the x-lane
// header and the lane member of the W3C baggage header (a baseline message
// carries neither: stale lane headers are removed).
//
// To make a retried publish safe, give the message an id, with
// jetstream.WithMsgID or a Nats-Msg-Id header: the stream stores a message
// once per id within its Duplicates window (two minutes with StreamConfig).
// An id derived from the event itself (an order number and what happened to
// it) also dedupes a producer that crashed and published again.
//
// A Publisher is safe for concurrent use.
type Publisher struct {
	js     jetstream.JetStream
	topic  string
	prop   lane.Propagator
	autoID bool
	tracer trace.Tracer // nil: no spans
}

// WithPublisherTracerProvider traces every publish with tp: a producer span with the message's
// lane, whose W3C traceparent the message carries, so that its consumer's span joins the trace.
// The default is lanestrace.TracerProvider(), which lanestrace.FromEnv sets; with neither,
// publishing is not traced.
func WithPublisherTracerProvider(tp trace.TracerProvider) PublisherOpt {
	return func(p *Publisher) error { p.tracer = lanestrace.Tracer(tp); return nil }
}

// PublisherOpt configures NewPublisher.
type PublisherOpt func(*Publisher) error

// WithPropagator sets the propagator that writes the lane headers (default:
// the zero lane.Propagator; its Aliases are removed from baseline messages).
func WithPropagator(p lane.Propagator) PublisherOpt {
	return func(pub *Publisher) error { pub.prop = p; return nil }
}

// WithMsgIDs makes the publisher give every message without an id a
// unique Nats-Msg-Id, so that each carries one to the handlers
// (Delivery.MsgID). It does not make retries safe by itself: a retry
// publishes a new copy with a new id; give ids yourself for that. The
// stream's deduplication costs some throughput (docs/mq.md).
func WithMsgIDs() PublisherOpt {
	return func(pub *Publisher) error { pub.autoID = true; return nil }
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
	p := &Publisher{js: js, topic: topic, tracer: lanestrace.Tracer(nil)}
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
// lane headers. A Nats-Msg-Id in msg's header, or given with
// jetstream.WithMsgID, deduplicates retries.
func (p *Publisher) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	v := lane.Carry(ctx) // the lane and its headers, read once
	out, err := p.stamp(v, msg)
	if err != nil {
		return nil, err
	}
	if p.tracer != nil {
		var span trace.Span
		if ctx, span = p.startSpan(ctx, v, out); span.IsRecording() {
			defer span.End()
			ack, err := p.js.PublishMsg(lane.SyncBaggage(ctx, v.Lane()), out, opts...)
			if err != nil {
				span.SetStatus(codes.Error, err.Error())
			}
			return ack, err
		}
	}
	// A JetStream that injects the context's OpenTelemetry baggage into the
	// message (a tracing wrapper) must write the lane stamped here.
	return p.js.PublishMsg(lane.SyncBaggage(ctx, v.Lane()), out, opts...)
}

// PublishMsgAsync is PublishMsg without waiting: the returned future
// delivers JetStream's acknowledgement or error. A message is stored only
// once its future says so; publish again (the Nats-Msg-Id makes that safe)
// when it fails. ctx gives the lane; the wait is bounded by the
// JetStream context's async options, not by ctx.
func (p *Publisher) PublishMsgAsync(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	v := lane.Carry(ctx)
	out, err := p.stamp(v, msg)
	if err != nil {
		return nil, err
	}
	if p.tracer != nil {
		if _, span := p.startSpan(ctx, v, out); span.IsRecording() {
			span.End() // the span of the publish, not of its acknowledgement
		}
	}
	return p.js.PublishMsgAsync(out, opts...)
}

// startSpan starts the producer span of out, published in the lane of v, and writes its
// traceparent into out's header.
func (p *Publisher) startSpan(ctx context.Context, v *lane.Carried, out *nats.Msg) (context.Context, trace.Span) {
	l := carriedLane(v)
	ctx, span := mqlane.StartProducerSpan(ctx, p.tracer, p.topic, "nats", out.Subject, l)
	if span.IsRecording() {
		if out.Header == nil {
			out.Header = nats.Header{}
		}
		traceContext.Inject(ctx, propagation.HeaderCarrier(out.Header))
	} else {
		span.End()
	}
	return ctx, span
}

// traceContext writes and reads the W3C traceparent header of traced messages.
var traceContext propagation.TraceContext

// carriedLane returns the lane of v, normalised ("" for the baseline or an invalid lane).
func carriedLane(v *lane.Carried) string {
	if v.Encoded() != nil {
		return v.Lane() // normalised already
	}
	return normLane(v.Lane())
}

// stamp returns the message to publish: a copy of msg on the subject of the lane of v (what
// the publishing context carries), with the lane headers and a message id.
func (p *Publisher) stamp(v *lane.Carried, msg *nats.Msg) (*nats.Msg, error) {
	if msg == nil {
		return nil, fmt.Errorf("%w: nil message", ErrInvalidSubject)
	}
	if err := checkSubject(msg.Subject); err != nil {
		return nil, err
	}
	l := carriedLane(v)
	var h nats.Header
	switch {
	case len(msg.Header) > 0:
		h = make(nats.Header, len(msg.Header)+3)
		for k, v := range msg.Header {
			h[k] = v
		}
		p.prop.InjectLane(l, lane.MessageHeader(h))
	case l != "":
		// The common case, without the propagator's merging: a lane message
		// with no headers of its own. The values are the lane's encoded
		// ones, shared: nothing modifies them.
		e := v.Encoded()
		if e == nil || e.Header[0] != l {
			e = lane.Encode(l)
		}
		h = nats.Header{lane.Header: e.Header, lane.BaggageHeader: e.Baggage}
	}
	if p.autoID && len(h[MsgIDHeader]) == 0 {
		if h == nil {
			h = make(nats.Header, 1)
		}
		h[MsgIDHeader] = []string{nuid.Next()}
	}
	tok := l
	if tok == "" {
		tok = BaselineToken
	}
	return &nats.Msg{Subject: p.topic + "." + tok + "." + msg.Subject, Header: h, Data: msg.Data}, nil
}
