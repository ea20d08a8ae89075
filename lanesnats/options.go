package lanesnats

import (
	"fmt"
	"go.opentelemetry.io/otel/trace"
	"log/slog"
	"os"
	"time"

	"github.com/lanesdev/lanes/registry"
)

// Defaults of the consumer options.
const (
	DefaultAckWait           = 30 * time.Second
	DefaultMaxDeliver        = 5
	DefaultBatch             = 256
	DefaultDiscoveryInterval = 5 * time.Second
	DefaultDrainTimeout      = 30 * time.Second
)

// DefaultRetryDelays are the delays before a failed message is delivered
// again: the n-th failure waits the n-th delay (the last one repeats).
var DefaultRetryDelays = []time.Duration{time.Second, 5 * time.Second, 15 * time.Second, 30 * time.Second}

// ConsumerOpt configures NewConsumer. An option given a value it cannot
// take makes NewConsumer fail with an error wrapping ErrInvalidOption.
type ConsumerOpt func(*consumerOptions) error

type consumerOptions struct {
	stream      string
	ackWait     time.Duration
	maxDeliver  int
	batch       int
	discovery   time.Duration
	ttl         time.Duration
	lane        string
	getenv      func(string) string
	log         *slog.Logger
	deadLetter  string
	retryDelays []time.Duration
	syncAck     bool
	drain       time.Duration
	startTime   time.Time
	tp          trace.TracerProvider
}

func defaultConsumerOptions() consumerOptions {
	return consumerOptions{
		ackWait:     DefaultAckWait,
		maxDeliver:  DefaultMaxDeliver,
		batch:       DefaultBatch,
		discovery:   DefaultDiscoveryInterval,
		ttl:         registry.DefaultTTL,
		getenv:      os.Getenv,
		retryDelays: DefaultRetryDelays,
		drain:       DefaultDrainTimeout,
	}
}

// WithConsumerTracerProvider traces every message the consumer handles with tp: a consumer span,
// child of the producer's (the message's traceparent), with the message's lane, the consumer's
// lane, why they differ and the delivery count; the handler's context carries it. The default is
// lanestrace.TracerProvider(), which lanestrace.FromEnv sets; with neither, nothing is traced.
func WithConsumerTracerProvider(tp trace.TracerProvider) ConsumerOpt {
	return func(o *consumerOptions) error { o.tp = tp; return nil }
}

func invalid(name string, v any, msg string) error {
	return fmt.Errorf("%w: %s %v: %s", ErrInvalidOption, name, v, msg)
}

// WithStream sets the name of the topic's stream (default: the topic).
func WithStream(name string) ConsumerOpt {
	return func(o *consumerOptions) error {
		if name == "" {
			return invalid("WithStream", `""`, "empty stream name")
		}
		o.stream = name
		return nil
	}
}

// WithAckWait sets the AckWait of the durable consumers the Consumer
// creates (default DefaultAckWait): how long JetStream waits for the ack of
// a delivered message before delivering it again. It bounds the hand-off
// window after a consumer crashes: its unacknowledged messages are delivered
// again within AckWait. A message whose handler runs longer is kept alive
// (InProgress) and not delivered again. It applies to durables created from
// then on; an existing durable keeps its own.
func WithAckWait(d time.Duration) ConsumerOpt {
	return func(o *consumerOptions) error {
		if d < 100*time.Millisecond {
			return invalid("WithAckWait", d, "must be at least 100ms")
		}
		o.ackWait = d
		return nil
	}
}

// WithMaxDeliver sets how many deliveries a message gets before it goes to
// the dead-letter topic (default DefaultMaxDeliver): the handler failed on
// the last one, or every earlier holder died without acknowledging it.
func WithMaxDeliver(n int) ConsumerOpt {
	return func(o *consumerOptions) error {
		if n < 1 {
			return invalid("WithMaxDeliver", n, "must be at least 1")
		}
		o.maxDeliver = n
		return nil
	}
}

// WithBatch sets how many messages one pull request asks for (default
// DefaultBatch). A consumer holds at most two batches per lane, in flight
// or waiting for the handler.
func WithBatch(n int) ConsumerOpt {
	return func(o *consumerOptions) error {
		if n < 1 || n > 10000 {
			return invalid("WithBatch", n, "must be within 1..10000")
		}
		o.batch = n
		return nil
	}
}

// WithDiscoveryInterval sets how often the consumer looks at the stream for
// lanes it does not know yet (default DefaultDiscoveryInterval). A message
// in a lane that no consumer of the group serves reaches the baseline (or
// the fallback lane that serves it) within one interval, plus the time to
// create the lane's durable consumer and pull.
func WithDiscoveryInterval(d time.Duration) ConsumerOpt {
	return func(o *consumerOptions) error {
		if d < 10*time.Millisecond {
			return invalid("WithDiscoveryInterval", d, "must be at least 10ms")
		}
		o.discovery = d
		return nil
	}
}

// WithTTL sets the lease TTL of the consumer's registration (default
// registry.DefaultTTL). When the process dies, the other consumers take its
// lanes over once the lease has expired.
func WithTTL(d time.Duration) ConsumerOpt {
	return func(o *consumerOptions) error {
		if d < 0 {
			return invalid("WithTTL", d, "must not be negative")
		}
		o.ttl = d
		return nil
	}
}

// WithLane sets the consumer's lane when ConsumerConfig.Instance does not
// set one (before LANES_LANE). "" is the baseline.
func WithLane(name string) ConsumerOpt {
	return func(o *consumerOptions) error { o.lane = name; return nil }
}

// WithEnv sets the function that reads the LANES_* variables (default
// os.Getenv).
func WithEnv(getenv func(string) string) ConsumerOpt {
	return func(o *consumerOptions) error {
		if getenv == nil {
			return invalid("WithEnv", "nil", "nil function")
		}
		o.getenv = getenv
		return nil
	}
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) ConsumerOpt {
	return func(o *consumerOptions) error {
		if l == nil {
			return invalid("WithLogger", "nil", "nil logger")
		}
		o.log = l
		return nil
	}
}

// WithDeadLetterTopic sets the topic that failed messages go to (default
// DeadLetterTopic(topic)). Its stream must exist; until it does, failed
// messages wait in their own stream and are retried.
func WithDeadLetterTopic(topic string) ConsumerOpt {
	return func(o *consumerOptions) error {
		if err := CheckTopic(topic); err != nil {
			return fmt.Errorf("%w: WithDeadLetterTopic: %w", ErrInvalidOption, err)
		}
		o.deadLetter = topic
		return nil
	}
}

// WithRetryDelays sets the delays before a failed message is delivered
// again (default DefaultRetryDelays): the n-th failure waits the n-th delay,
// the last one repeating.
func WithRetryDelays(d ...time.Duration) ConsumerOpt {
	return func(o *consumerOptions) error {
		if len(d) == 0 {
			return invalid("WithRetryDelays", d, "give at least one delay")
		}
		for _, x := range d {
			if x < 0 {
				return invalid("WithRetryDelays", d, "negative delay")
			}
		}
		o.retryDelays = append([]time.Duration(nil), d...)
		return nil
	}
}

// WithSyncAck makes the consumer wait for JetStream to confirm each ack
// before taking the next message, so that a message counted as handled is
// known to be acknowledged. An ack lost with a broken connection is logged,
// and the message comes back after AckWait either way. It costs a round
// trip per message.
func WithSyncAck() ConsumerOpt {
	return func(o *consumerOptions) error { o.syncAck = true; return nil }
}

// WithDrainTimeout bounds how long Close, and a lane handed over to another
// consumer, wait for the messages already fetched to be handled (default
// DefaultDrainTimeout). After it, handlers' contexts are cancelled and the
// messages not handled yet are given back (negatively acknowledged) for
// another consumer.
func WithDrainTimeout(d time.Duration) ConsumerOpt {
	return func(o *consumerOptions) error {
		if d <= 0 {
			return invalid("WithDrainTimeout", d, "must be positive")
		}
		o.drain = d
		return nil
	}
}

// WithStartTime makes the durable consumers the group creates start at t
// instead of at the first message of the stream. Give every consumer of the
// group the same t (for example the day the group was deployed), or a group
// new to an old stream handles the stream's whole history, lane by lane.
func WithStartTime(t time.Time) ConsumerOpt {
	return func(o *consumerOptions) error {
		if t.IsZero() {
			return invalid("WithStartTime", t, "zero time")
		}
		o.startTime = t
		return nil
	}
}
