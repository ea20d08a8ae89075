package lanesnats_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"

	"github.com/lanesdev/lanes/internal/testkit/natstest"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesnats"
)

// tracingJS is a JetStream wrapped the way tracing wrappers are: it writes
// the OpenTelemetry baggage of the context into every message it publishes.
type tracingJS struct{ jetstream.JetStream }

func (j tracingJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	propagation.Baggage{}.Inject(ctx, propagation.HeaderCarrier(m.Header))
	return j.JetStream.PublishMsg(ctx, m, opts...)
}

// TestPublishKeepsOpenTelemetryInStep: a JetStream that writes the
// context's OpenTelemetry baggage into the message after the publisher
// stamped it writes the lane that the publisher stamped, not a stale one.
func TestPublishKeepsOpenTelemetryInStep(t *testing.T) {
	e := newEnv(t, natstest.Embedded(t), "")
	pub, err := lanesnats.NewPublisher(tracingJS{e.js}, e.topic)
	if err != nil {
		t.Fatal(err)
	}
	b, err := baggage.Parse("lane=alice,team=x")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stale := baggage.ContextWithBaggage(ctx, b) // OpenTelemetry says alice, lanes says baseline
	for _, tc := range []struct {
		ctx     context.Context
		subject string
		lane    string
	}{
		{stale, "orders._.created", ""},
		{lane.WithLane(stale, "bob"), "orders.bob.created", "bob"},
	} {
		ack, err := pub.Publish(tc.ctx, "created", nil)
		if err != nil {
			t.Fatal(err)
		}
		s, err := e.js.Stream(ctx, e.topic)
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.GetMsg(ctx, ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		got, _, _ := lane.Propagator{}.Extract(lane.MessageHeader(m.Header))
		if m.Subject != tc.subject || got != tc.lane {
			t.Errorf("published on %q with lane %q; want %q, lane %q", m.Subject, got, tc.subject, tc.lane)
		}
		// Every baggage value, in every spelling of the header, says so.
		for _, v := range lane.MessageHeader(m.Header).Values("baggage") {
			if bag, _ := baggage.Parse(v); bag.Member("lane").Value() != tc.lane {
				t.Errorf("published on %q with a baggage value %q", m.Subject, v)
			}
		}
	}
}
