package lanesamqp

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

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

	tables laneTables

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
	carried := lane.Carry(ctx)
	l := mqlane.Norm(carried.Lane())
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
	out := msg
	out.Headers = p.messageHeaders(ctx, carried, l, msg.Headers, span != nil)
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

// messageHeaders returns the headers of a message of lane l (carried's,
// normalised) whose own headers are mh, with the trace context of ctx when
// traced. The common message, of a lane, untraced and without headers of
// its own, gets its lane's table, made once (laneTables).
func (p *Publisher) messageHeaders(ctx context.Context, carried *lane.Carried, l string, mh amqp.Table, traced bool) amqp.Table {
	switch {
	case len(mh) > 0 || traced:
		return p.headers(ctx, l, mh, traced)
	case l == "":
		return nil // a baseline message without headers: none to write or remove
	}
	return p.tables.of(carried.Encoded(), l)
}

// headers returns the headers of a message of lane l (normalised) whose own
// headers are mh, with the trace context of ctx when traced.
func (p *Publisher) headers(ctx context.Context, l string, mh amqp.Table, traced bool) amqp.Table {
	var h map[string][]string
	if len(mh) > 0 {
		h = make(map[string][]string, len(mh)+2)
		for k, v := range mh {
			if s, ok := v.(string); ok {
				h[k] = []string{s}
			}
		}
	}
	h = mqlane.Stamp(p.prop, l, h)
	if traced {
		if h == nil {
			h = map[string][]string{}
		}
		mqlane.InjectTrace(ctx, h)
	}
	out := make(amqp.Table, len(mh)+len(h))
	for k, v := range mh {
		if _, ok := v.(string); !ok {
			out[k] = v // other types pass unchanged
		}
	}
	for k, vs := range h {
		out[k] = strings.Join(vs, ",")
	}
	delete(out, RouteHeader)
	if l != "" {
		out[RouteHeader] = l
	}
	return out
}

// laneTables holds, per lane, the headers of a message published without
// headers of its own and untraced: x-lane, baggage and RouteHeader, made
// once, as lane.Encode makes the lane's headers of a call. amqp091 only
// reads a message's headers, while it writes them out within the publish,
// so one table serves every publish of the lane. It holds up to
// maxLaneTables lanes; a message of a lane past them gets a table of its
// own.
type laneTables struct {
	m sync.Map // lane name -> amqp.Table
	n atomic.Int32
}

const maxLaneTables = 256

// of returns the headers of lane l (normalised with mqlane.Norm), written
// from enc, the lane's encoding that the publish's context carries, when
// there is one.
func (t *laneTables) of(enc *lane.Encoded, l string) amqp.Table {
	if v, ok := t.m.Load(l); ok {
		return v.(amqp.Table)
	}
	var tab amqp.Table
	if enc != nil {
		tab = amqp.Table{laneHeader: enc.Header[0], lane.BaggageHeader: enc.Baggage[0], RouteHeader: l}
	} else {
		tab = amqp.Table{laneHeader: l, lane.BaggageHeader: lane.BaggageKey + "=" + l, RouteHeader: l}
	}
	if t.n.Load() < maxLaneTables {
		if _, loaded := t.m.LoadOrStore(l, tab); !loaded {
			t.n.Add(1)
		}
	}
	return tab
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
