package lanesamqp

import (
	"context"
	"fmt"
	"strings"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/internal/lib/mqlane"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanestrace"
)

// laneHeader is the lane header that consumers read.
const laneHeader = lane.Header

// RouteHeader is the header that the group exchanges route by: the lane,
// as in x-lane. (RabbitMQ's headers exchanges ignore headers whose names
// begin with "x-".) A message that carries x-lane but not this header, from
// another producer, reaches the baseline queue and is moved to its lane's
// queue from there.
const RouteHeader = "lanes-lane"

// A Publisher publishes the messages of one topic in the lane of the
// context, to the topic's exchange, persistent, with the lane in the x-lane
// and baggage headers (a baseline message carries neither) and the producer
// span's traceparent when traced, on a channel in confirm mode. It dials
// again after its connection is lost. It is safe for concurrent use.
type Publisher struct {
	dial   Dialer
	topic  string
	prop   lane.Propagator
	tracer trace.Tracer

	mu   sync.Mutex
	conn *amqp.Connection
	ch   *amqp.Channel
}

// PublisherOpt configures NewPublisher.
type PublisherOpt func(*Publisher) error

// WithPropagator sets the propagator that writes the lane headers.
func WithPropagator(p lane.Propagator) PublisherOpt {
	return func(pub *Publisher) error { pub.prop = p; return nil }
}

// WithPublisherTracerProvider traces every publish with tp (default
// lanestrace.TracerProvider()).
func WithPublisherTracerProvider(tp trace.TracerProvider) PublisherOpt {
	return func(p *Publisher) error { p.tracer = lanestrace.Tracer(tp); return nil }
}

// NewPublisher returns a publisher of topic on the connections of dial.
// Close closes its connection.
func NewPublisher(dial Dialer, topic string, opts ...PublisherOpt) (*Publisher, error) {
	if dial == nil {
		return nil, fmt.Errorf("%w: nil Dialer", ErrInvalidOption)
	}
	if err := CheckName("topic", topic); err != nil {
		return nil, err
	}
	p := &Publisher{dial: dial, topic: topic, tracer: lanestrace.Tracer(nil)}
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

// Close closes the publisher's connection.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		err := p.conn.Close()
		p.conn, p.ch = nil, nil
		return err
	}
	return nil
}

// Publish publishes body with the routing key subject in the lane of ctx
// and waits for the broker's confirm.
func (p *Publisher) Publish(ctx context.Context, subject string, body []byte) error {
	return p.PublishMsg(ctx, subject, amqp.Publishing{Body: body})
}

// PublishMsg publishes a copy of msg (persistent, with the lane headers)
// with the routing key subject in the lane of ctx, and waits for the
// broker's confirm: once it returns nil, the broker has the message.
func (p *Publisher) PublishMsg(ctx context.Context, subject string, msg amqp.Publishing) error {
	dc, span, err := p.PublishMsgAsync(ctx, subject, msg)
	if span != nil {
		defer span.End()
	}
	if err == nil {
		var ok bool
		if ok, err = dc.WaitContext(ctx); err == nil && !ok {
			err = ErrNotConfirmed
		}
	}
	if err != nil && span != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// PublishMsgAsync publishes as PublishMsg does without waiting for the
// confirm: the returned confirmation says when the broker has the message
// (Acked) or refused it. The span, when not nil, is the producer span: the
// caller ends it.
func (p *Publisher) PublishMsgAsync(ctx context.Context, subject string, msg amqp.Publishing) (*amqp.DeferredConfirmation, trace.Span, error) {
	l := mqlane.Norm(lane.FromContext(ctx))
	var h map[string][]string
	if len(msg.Headers) > 0 {
		h = make(map[string][]string, len(msg.Headers)+2)
		for k, v := range msg.Headers {
			if s, ok := v.(string); ok {
				h[k] = []string{s}
			}
		}
	}
	var span trace.Span
	if p.tracer != nil {
		var sctx context.Context
		if sctx, span = mqlane.StartProducerSpan(ctx, p.tracer, p.topic, "rabbitmq", Exchange(p.topic), l); span.IsRecording() {
			ctx = sctx
		} else {
			span.End()
			span = nil
		}
	}
	h = mqlane.Stamp(p.prop, l, h)
	if span != nil {
		if h == nil {
			h = map[string][]string{}
		}
		mqlane.InjectTrace(ctx, h)
	}
	out := msg
	out.Headers = make(amqp.Table, len(msg.Headers)+len(h))
	for k, v := range msg.Headers {
		if _, ok := v.(string); !ok {
			out.Headers[k] = v // other types pass unchanged
		}
	}
	for k, vs := range h {
		out.Headers[k] = strings.Join(vs, ",")
	}
	delete(out.Headers, RouteHeader)
	if l != "" {
		out.Headers[RouteHeader] = l
	}
	out.DeliveryMode = amqp.Persistent
	ch, err := p.channel(ctx)
	if err != nil {
		return nil, span, err
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, Exchange(p.topic), subject, false, false, out)
	if err != nil {
		p.reset(ch)
		return nil, span, fmt.Errorf("lanesamqp: publish to %s: %w", Exchange(p.topic), err)
	}
	return dc, span, nil
}

// channel returns the publisher's confirm channel, dialling and declaring
// the topic's exchange when there is none.
func (p *Publisher) channel(ctx context.Context) (*amqp.Channel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ch != nil && !p.ch.IsClosed() {
		return p.ch, nil
	}
	if p.conn == nil || p.conn.IsClosed() {
		conn, err := p.dial(ctx)
		if err != nil {
			return nil, fmt.Errorf("lanesamqp: dial: %w", err)
		}
		p.conn = conn
	}
	ch, err := p.conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err == nil {
		err = ch.ExchangeDeclare(Exchange(p.topic), amqp.ExchangeFanout, true, false, false, false, nil)
	}
	if err != nil {
		p.conn.Close()
		p.conn = nil
		return nil, fmt.Errorf("lanesamqp: publisher channel: %w", err)
	}
	p.ch = ch
	return ch, nil
}

// reset drops ch after a failure, so that the next publish opens another.
func (p *Publisher) reset(ch *amqp.Channel) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ch == ch {
		ch.Close()
		p.ch = nil
	}
}
