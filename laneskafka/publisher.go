package laneskafka

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/internal/lib/mqlane"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanestrace"
)

// maxKnownTopics bounds the publisher's memory of the lane topics it has
// created: lanes come from callers' contexts. Past it the topic remembered
// longest is forgotten first (creating an existing topic again is a cheap
// no-op), and counted (Publisher.Forgotten).
var maxKnownTopics = 4096 // a variable for the tests

// A Publisher publishes the messages of one topic in the lane of the
// context: to the lane's topic (LaneTopic), with the lane in the x-lane
// header and the lane member of the W3C baggage header (a baseline message
// carries neither), and the producer span's traceparent when traced. It
// creates a lane's topic on its first message in that lane. A Publisher is
// safe for concurrent use.
type Publisher struct {
	cl         *kgo.Client
	adm        *kadm.Client
	topic      string
	prop       lane.Propagator
	partitions int32
	tracer     trace.Tracer // nil: no spans

	mu        sync.Mutex
	known     map[string][]kgo.RecordHeader // lane topics created, with the lane headers of a record without headers of its own
	order     []string                      // the keys of known, oldest first
	forgotten int64
}

// Forgotten counts the lane topics the publisher has forgotten having
// created, past the bound of its memory (4,096): each is asked for again
// at its next message.
func (p *Publisher) Forgotten() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.forgotten
}

// PublisherOpt configures NewPublisher.
type PublisherOpt func(*Publisher) error

// WithPropagator sets the propagator that writes the lane headers (default:
// the zero lane.Propagator).
func WithPropagator(p lane.Propagator) PublisherOpt {
	return func(pub *Publisher) error { pub.prop = p; return nil }
}

// WithPartitions sets the number of partitions of the lane topics the
// publisher creates (default 1). Records with the same key go to the same
// partition, and are handled in order.
func WithPartitions(n int) PublisherOpt {
	return func(pub *Publisher) error {
		if n < 1 || n > 10000 {
			return invalid("WithPartitions", n, "must be 1 to 10000")
		}
		pub.partitions = int32(n)
		return nil
	}
}

// WithPublisherTracerProvider traces every publish with tp (default
// lanestrace.TracerProvider()).
func WithPublisherTracerProvider(tp trace.TracerProvider) PublisherOpt {
	return func(p *Publisher) error { p.tracer = lanestrace.Tracer(tp); return nil }
}

// NewPublisher returns a publisher of topic on the client cl (which it
// does not close).
func NewPublisher(cl *kgo.Client, topic string, opts ...PublisherOpt) (*Publisher, error) {
	if cl == nil {
		return nil, fmt.Errorf("%w: nil *kgo.Client", ErrInvalidOption)
	}
	if err := CheckTopic(topic); err != nil {
		return nil, err
	}
	p := &Publisher{cl: cl, adm: kadm.NewClient(cl), topic: topic, partitions: DefaultPartitions,
		tracer: lanestrace.Tracer(nil), known: map[string][]kgo.RecordHeader{}}
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

// Publish publishes a record with key and value in the lane of ctx and
// waits for the brokers' acknowledgement.
func (p *Publisher) Publish(ctx context.Context, key, value []byte) error {
	return p.PublishRecord(ctx, &kgo.Record{Key: key, Value: value})
}

// PublishRecord publishes a copy of r (its Topic is ignored) to the topic of
// the lane of ctx, with the lane headers, and waits for the brokers'
// acknowledgement.
func (p *Publisher) PublishRecord(ctx context.Context, r *kgo.Record) error {
	out, span, err := p.stamp(ctx, r)
	if err != nil {
		return err
	}
	if span != nil {
		defer span.End()
	}
	if err := p.cl.ProduceSync(ctx, out).FirstErr(); err != nil {
		if span != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		return fmt.Errorf("laneskafka: publish to %s: %w", out.Topic, err)
	}
	return nil
}

// PublishRecordAsync is PublishRecord without waiting: promise (which may be
// nil) is called with the record as published and the brokers' answer,
// from the client's goroutine, as kgo.Client.Produce does. ctx gives the
// lane, and bounds the creation of the lane's topic, the first time.
func (p *Publisher) PublishRecordAsync(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error)) error {
	out, span, err := p.stamp(ctx, r)
	if err != nil {
		return err
	}
	if span != nil {
		span.End() // the span of the publish, not of its acknowledgement
	}
	p.cl.Produce(ctx, out, promise)
	return nil
}

// stamp returns the record to publish: a copy of r on the lane's topic,
// with the lane headers, and the producer span when traced (the caller
// ends it).
func (p *Publisher) stamp(ctx context.Context, r *kgo.Record) (*kgo.Record, trace.Span, error) {
	if r == nil {
		return nil, nil, fmt.Errorf("%w: nil record", ErrInvalidOption)
	}
	l := mqlane.Norm(lane.FromContext(ctx))
	kt := LaneTopic(p.topic, l)
	laneHeaders, err := p.ensure(ctx, kt, l)
	if err != nil {
		return nil, nil, err
	}
	var h map[string][]string
	if len(r.Headers) > 0 {
		h = make(map[string][]string, len(r.Headers)+2)
		for _, rh := range r.Headers {
			h[rh.Key] = append(h[rh.Key], string(rh.Value))
		}
	}
	var span trace.Span
	if p.tracer != nil {
		var sctx context.Context
		sctx, span = mqlane.StartProducerSpan(ctx, p.tracer, p.topic, "kafka", kt, l)
		if !span.IsRecording() {
			span.End()
			span = nil
		} else {
			ctx = sctx
		}
	}
	if h == nil && span == nil {
		// The common case: a record with no headers of its own, untraced.
		return &kgo.Record{Topic: kt, Key: r.Key, Value: r.Value, Headers: laneHeaders, Timestamp: r.Timestamp}, nil, nil
	}
	h = mqlane.Stamp(p.prop, l, h)
	if span != nil {
		if h == nil {
			h = map[string][]string{}
		}
		mqlane.InjectTrace(ctx, h)
	}
	return &kgo.Record{Topic: kt, Key: r.Key, Value: r.Value, Headers: recordHeaders(h), Timestamp: r.Timestamp}, span, nil
}

// recordHeaders turns a header map into record headers.
func recordHeaders(h map[string][]string) []kgo.RecordHeader {
	if len(h) == 0 {
		return nil
	}
	out := make([]kgo.RecordHeader, 0, len(h))
	for k, vs := range h {
		for _, v := range vs {
			out = append(out, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
	}
	return out
}

// ensure creates the Kafka topic kt of lane l once, with the publisher's
// partitions, and returns the lane headers of a record without headers of
// its own (shared: not to be modified).
func (p *Publisher) ensure(ctx context.Context, kt, l string) ([]kgo.RecordHeader, error) {
	p.mu.Lock()
	hs, ok := p.known[kt]
	p.mu.Unlock()
	if ok {
		return hs, nil
	}
	if err := CreateTopic(ctx, p.adm, kt, p.partitions); err != nil {
		return nil, err
	}
	hs = recordHeaders(mqlane.Stamp(p.prop, l, nil))
	p.mu.Lock()
	if _, ok := p.known[kt]; !ok {
		if len(p.order) >= maxKnownTopics {
			delete(p.known, p.order[0])
			p.order = append(p.order[:0], p.order[1:]...)
			p.forgotten++
		}
		p.order = append(p.order, kt)
	}
	p.known[kt] = hs
	p.mu.Unlock()
	return hs, nil
}

// CreateTopic creates the Kafka topic kt with partitions partitions and the
// brokers' default replication, unless it exists.
func CreateTopic(ctx context.Context, adm *kadm.Client, kt string, partitions int32) error {
	res, err := adm.CreateTopic(ctx, partitions, -1, nil, kt)
	if err == nil {
		err = res.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("laneskafka: create topic %s: %w", kt, err)
	}
	return nil
}
