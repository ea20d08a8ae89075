package laneskafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/internal/lib/mqlane"
	"github.com/lanesdev/lanes/lanestrace"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// Label keys that NewConsumer adds to the instance it registers.
const (
	LabelService = "lanes.mq/service"
	LabelGroup   = "lanes.mq/group"
	LabelTopic   = "lanes.mq/topic"
)

// apiTimeout bounds one admin request or commit.
const apiTimeout = 5 * time.Second

// ConsumerConfig says what a Consumer consumes and where it registers.
type ConsumerConfig struct {
	// Service is the consuming service, such as "billing". Required.
	Service string
	// Group is the consumer group within the service: every message of the
	// topic is handled once per group. Required; see CheckGroup.
	Group string
	// Topic is the topic consumed. Required; see CheckTopic.
	Topic string
	// ClientOpts are the options of the Kafka clients the consumer makes:
	// the seed brokers (kgo.SeedBrokers, required), TLS, SASL, and group
	// settings such as kgo.SessionTimeout (how soon the group notices a
	// dead member). The consumer adds the group, the topic, manual commits
	// and kgo.BlockRebalanceOnPoll.
	ClientOpts []kgo.Opt
	// Registry is where the consumer registers (under the service
	// "mq.<Service>.<Group>"), with a lease that keeps it alive. Required.
	Registry registry.Registry
	// Engine decides which consumers handle which lane; it must follow
	// Registry and, for fallback chains, strict lanes and tag rules, the
	// policy store. Required.
	Engine *routing.Engine
	// Instance holds the fields of the registration that code sets, as in
	// lanesnats; Addr defaults to LANES_ADDR, then to the first seed
	// broker.
	Instance registry.Instance
}

// A Handler handles the messages a Consumer delivers. ctx carries the lane
// of the message. Returning nil marks the record handled: its offset is
// committed after the handlers of the records polled with it have returned.
// Returning an error handles it again after a delay (WithRetryDelays),
// until WithMaxDeliver attempts failed; it then goes to the dead-letter
// topic. A record is handled again after a consumer died before committing
// it: deduplicate on (Topic, Partition, Offset) when that matters.
type Handler interface {
	HandleMessage(ctx context.Context, d *Delivery) error
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, d *Delivery) error

// HandleMessage calls f(ctx, d).
func (f HandlerFunc) HandleMessage(ctx context.Context, d *Delivery) error { return f(ctx, d) }

// Delivery is one handling of a record.
type Delivery struct {
	// Lane is the lane of the record ("" the baseline): the lane of its
	// topic. It is also the lane of the handler's context.
	Lane string
	// Key, Value and Headers are the record's (Header reads one).
	Key, Value []byte
	Headers    []kgo.RecordHeader
	// Topic, Partition and Offset identify the record.
	Topic     string
	Partition int32
	Offset    int64
	// Attempt counts this consumer's attempts at the record, this one
	// included.
	Attempt int
	// Record is the record as received. Do not commit it: the Consumer does.
	Record *kgo.Record
}

// Stats counts what a Consumer did.
type Stats struct {
	Handled      uint64 // records handled and committed
	Failed       uint64 // handler errors
	DeadLettered uint64 // records sent to the dead-letter topic
}

// A Consumer handles the messages of one topic for one consumer group of a
// service, in the lanes the routing engine gives it (internal/lib/mqlane),
// each lane's topic in that lane's Kafka consumer group. See docs/mq.md.
type Consumer struct {
	cfg     ConsumerConfig
	o       consumerOptions
	h       Handler
	log     *slog.Logger
	engine  *routing.Engine
	m       *mqlane.Member
	inst    registry.Instance
	lease   registry.Lease
	meta    *kgo.Client // discovery and dead letters
	adm     *kadm.Client
	tracer  trace.Tracer
	regName string

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	runs   *mqlane.Runs // one per lane consumed

	known map[string]bool // lanes discovered; coordinator only

	closeOnce sync.Once

	handled, failed, deadLettered atomic.Uint64
}

// NewConsumer registers a consumer instance of cfg.Service for cfg.Group and
// starts handling the lanes the routing engine gives it, with h. It returns
// once registered; Close stops it.
func NewConsumer(ctx context.Context, cfg ConsumerConfig, h Handler, opts ...ConsumerOpt) (*Consumer, error) {
	o := defaultConsumerOptions()
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	switch {
	case h == nil:
		return nil, fmt.Errorf("%w: nil Handler", ErrInvalidOption)
	case cfg.Registry == nil:
		return nil, fmt.Errorf("%w: ConsumerConfig.Registry is required", ErrInvalidOption)
	case cfg.Engine == nil:
		return nil, fmt.Errorf("%w: ConsumerConfig.Engine is required", ErrInvalidOption)
	}
	if err := registry.CheckService(cfg.Service); err != nil {
		return nil, fmt.Errorf("%w: ConsumerConfig.Service: %w", ErrInvalidOption, err)
	}
	if err := CheckGroup(cfg.Group); err != nil {
		return nil, err
	}
	if err := CheckTopic(cfg.Topic); err != nil {
		return nil, err
	}
	regName := mqlane.RegistryService(cfg.Service, cfg.Group)
	if s := cfg.Instance.Service; s != "" && s != regName {
		return nil, fmt.Errorf("%w: ConsumerConfig.Instance.Service %q: leave it empty (the consumer registers as %q)", ErrInvalidOption, s, regName)
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	meta, err := kgo.NewClient(cfg.ClientOpts...)
	if err != nil {
		return nil, fmt.Errorf("%w: ConsumerConfig.ClientOpts: %w", ErrInvalidOption, err)
	}
	c := &Consumer{cfg: cfg, o: o, h: h, engine: cfg.Engine, meta: meta, adm: kadm.NewClient(meta), regName: regName,
		tracer: lanestrace.Tracer(o.tp), done: make(chan struct{}), known: map[string]bool{},
		log: o.log.With("service", cfg.Service, "group", cfg.Group, "topic", cfg.Topic)}
	in := cfg.Instance
	in.Service = regName
	in.Labels = mqlane.Labels(in.Labels, cfg.Service, cfg.Group, cfg.Topic)
	var seed net.Addr
	if seeds := meta.OptValues(kgo.SeedBrokers); len(seeds) > 0 {
		if ss, ok := seeds[0].([]string); ok && len(ss) > 0 {
			if a, err := net.ResolveTCPAddr("tcp", ss[0]); err == nil {
				seed = a
			}
		}
	}
	c.inst, err = registry.Place(in, o.lane, "", o.getenv, seed)
	if err != nil {
		meta.Close()
		return nil, fmt.Errorf("laneskafka: instance: %w", err)
	}
	c.m, err = mqlane.Join(ctx, cfg.Registry, cfg.Engine, c.inst, o.ttl)
	if err != nil {
		meta.Close()
		return nil, fmt.Errorf("laneskafka: %w", err)
	}
	c.inst, c.lease = c.m.Inst, c.m.Lease
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.log = c.log.With("id", c.inst.ID, "lane", c.inst.Lane)
	c.runs = mqlane.NewRuns(o.drain, c.log, func(l string) string { return "topic " + LaneTopic(cfg.Topic, l) }, c.consume)
	go c.run() // owned by c: Close waits for done
	return c, nil
}

// Instance returns the instance the consumer registered.
func (c *Consumer) Instance() registry.Instance { return c.inst.Clone() }

// Owned returns the lanes whose topics the consumer consumes now, or still
// settles after handing them on, sorted ("" the baseline).
func (c *Consumer) Owned() []string { return c.runs.Owned() }

// Stats returns the consumer's counters.
func (c *Consumer) Stats() Stats {
	return Stats{Handled: c.handled.Load(), Failed: c.failed.Load(), DeadLettered: c.deadLettered.Load()}
}

// Done is closed once the consumer has stopped.
func (c *Consumer) Done() <-chan struct{} { return c.done }

// Err returns nil while the consumer runs, ErrClosed after Close, or why it
// stopped by itself (an error wrapping ErrRegistrationLost).
func (c *Consumer) Err() error { return c.runs.Err() }

// Close stops the consumer: it deregisters, so that the others take its
// lanes over, stops polling, waits for the records already polled to be
// handled and committed (WithDrainTimeout), leaves the lanes' groups and
// waits for every goroutine it started. It is safe to call more than once.
func (c *Consumer) Close() error {
	c.closeOnce.Do(func() {
		c.runs.SetErr(ErrClosed)
		c.cancel()
		if err := c.lease.Close(); err != nil && !errors.Is(err, registry.ErrClosed) {
			c.log.Warn("lanes: deregistering the consumer", "err", err)
		}
		<-c.done
		c.meta.Close()
	})
	if err := c.Err(); !errors.Is(err, ErrClosed) {
		return err
	}
	return nil
}

// abort stops the consumer as a crash would: nothing more is committed and
// no group is left; the handlers' contexts are cancelled at once.
func (c *Consumer) abort() {
	c.runs.Abort()
	c.Close()
}

// run is the coordinator: it decides which lanes the consumer consumes,
// again whenever the instances, the policy or the topic's lanes change
// (mqlane.Member.Run).
func (c *Consumer) run() {
	defer c.shutdown()
	if err := c.m.Run(c.ctx, c.o.discovery, c.known, maxKnownTopics, c.discover, c.runs.Reconcile); err != nil {
		err = fmt.Errorf("%w: %w", ErrRegistrationLost, err)
		c.log.Error("lanes: consumer registration lost; stopping", "err", err)
		c.runs.SetErr(err)
	}
}

// shutdown stops every run and waits for them.
func (c *Consumer) shutdown() {
	c.runs.Close()
	c.cancel()
	c.runs.SetErr(ErrClosed)
	close(c.done)
}

// discover adds the lanes of the topic's lane topics to the known ones.
func (c *Consumer) discover(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	topics, err := c.adm.ListTopics(ctx)
	if err != nil {
		if c.ctx.Err() == nil {
			c.log.Warn("lanes: cannot list the lane topics", "err", err)
		}
		return
	}
	for _, kt := range topics.Names() {
		if !strings.HasPrefix(kt, c.cfg.Topic) {
			continue
		}
		if l, ok := topicLane(c.cfg.Topic, kt); ok && !c.known[l] && len(c.known) < maxKnownTopics {
			c.known[l] = true
		}
	}
}

// delay is the delay after failed attempt n.
func (c *Consumer) delay(n int) time.Duration { return mqlane.Delay(c.o.retryDelays, n) }

// Header returns the value of the first record header named key, matched
// without regard to case, or "".
func (d *Delivery) Header(key string) string {
	for _, h := range d.Headers {
		if strings.EqualFold(h.Key, key) {
			return string(h.Value)
		}
	}
	return ""
}

// recordCarrier reads record headers as a propagation.TextMapCarrier.
type recordCarrier []kgo.RecordHeader

func (c recordCarrier) Get(key string) string { return (&Delivery{Headers: c}).Header(key) }
func (c recordCarrier) Set(string, string)    {}
func (c recordCarrier) Keys() []string {
	out := make([]string, len(c))
	for i, h := range c {
		out[i] = h.Key
	}
	return out
}
