package lanesamqp

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/registry"
)

// Defaults of the consumer options.
const (
	DefaultMaxDeliver        = 5
	DefaultPrefetch          = 256
	DefaultDiscoveryInterval = 5 * time.Second
	DefaultDrainTimeout      = 30 * time.Second
)

// DefaultRetryDelays are the delays before a failed message is handled
// again: the n-th failure waits the n-th delay (the last one repeats).
var DefaultRetryDelays = []time.Duration{time.Second, 5 * time.Second, 15 * time.Second, 30 * time.Second}

// ConsumerOpt configures NewConsumer. An option given a value it cannot
// take makes NewConsumer fail with an error wrapping ErrInvalidOption.
type ConsumerOpt func(*consumerOptions) error

type consumerOptions struct {
	maxDeliver  int
	prefetch    int
	discovery   time.Duration
	ttl         time.Duration
	lane        string
	getenv      func(string) string
	log         *slog.Logger
	retryDelays []time.Duration
	drain       time.Duration
	tp          trace.TracerProvider
}

func defaultConsumerOptions() consumerOptions {
	return consumerOptions{
		maxDeliver:  DefaultMaxDeliver,
		prefetch:    DefaultPrefetch,
		discovery:   DefaultDiscoveryInterval,
		ttl:         registry.DefaultTTL,
		getenv:      os.Getenv,
		retryDelays: DefaultRetryDelays,
		drain:       DefaultDrainTimeout,
	}
}

func invalid(name string, v any, msg string) error {
	return fmt.Errorf("%w: %s %v: %s", ErrInvalidOption, name, v, msg)
}

// WithMaxDeliver sets how many times a message is handled before it goes to
// the dead-letter queue when its handler keeps failing (default 5).
func WithMaxDeliver(n int) ConsumerOpt {
	return func(o *consumerOptions) error {
		if n < 1 {
			return invalid("WithMaxDeliver", n, "must be at least 1")
		}
		o.maxDeliver = n
		return nil
	}
}

// WithRetryDelays sets the delays before a failed message is handled again
// (default DefaultRetryDelays). The lane's queue waits meanwhile: order
// within a lane is kept.
func WithRetryDelays(d ...time.Duration) ConsumerOpt {
	return func(o *consumerOptions) error {
		if len(d) == 0 {
			return invalid("WithRetryDelays", d, "at least one delay")
		}
		for _, x := range d {
			if x < 0 {
				return invalid("WithRetryDelays", d, "delays must not be negative")
			}
		}
		o.retryDelays = append([]time.Duration(nil), d...)
		return nil
	}
}

// WithPrefetch sets how many unacknowledged messages the broker sends a
// lane's consumer ahead (default 256; basic.qos).
func WithPrefetch(n int) ConsumerOpt {
	return func(o *consumerOptions) error {
		if n < 1 || n > 65535 {
			return invalid("WithPrefetch", n, "must be 1 to 65535")
		}
		o.prefetch = n
		return nil
	}
}

// WithDiscoveryInterval sets how often the consumer reads the group's index
// of lane queues (default 5s): a consumer learns of a lane queue that others
// declared within it.
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
// registry.DefaultTTL): when the process dies, the other consumers take its
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
	return func(o *consumerOptions) error { o.log = l; return nil }
}

// WithDrainTimeout sets how long a lane that moves away, or Close, waits
// for the handlers of the messages already received (default 30s); then
// their contexts are cancelled and what was not handled goes back to the
// queue, for the next owner.
func WithDrainTimeout(d time.Duration) ConsumerOpt {
	return func(o *consumerOptions) error {
		if d <= 0 {
			return invalid("WithDrainTimeout", d, "must be positive")
		}
		o.drain = d
		return nil
	}
}

// WithConsumerTracerProvider traces every message the consumer handles with
// tp: a consumer span, child of the producer's, with the message's lane,
// the consumer's, why they differ and the delivery count. The default is
// lanestrace.TracerProvider().
func WithConsumerTracerProvider(tp trace.TracerProvider) ConsumerOpt {
	return func(o *consumerOptions) error { o.tp = tp; return nil }
}
