package lanesamqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/internal/lib/mqlane"
	"github.com/lanesdev/lanes/lane"
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

// apiTimeout bounds one broker operation.
const apiTimeout = 5 * time.Second

// ConsumerConfig says what a Consumer consumes and where it registers.
type ConsumerConfig struct {
	// Service is the consuming service, such as "billing". Required; also
	// a part of queue names (CheckName).
	Service string
	// Group is the consumer group within the service: every message of the
	// topic is handled once per group. Required; see CheckName.
	Group string
	// Topic is the topic consumed. Required; see CheckName.
	Topic string
	// Dial opens the consumer's connections (one per lane it consumes, and
	// one for its bookkeeping), again after one is lost. Required.
	Dial Dialer
	// Addr is the address registered when neither Instance.Addr nor
	// LANES_ADDR gives one: the broker's host:port, for example.
	Addr string
	// Registry and Engine: where the consumer registers (under the service
	// "mq.<Service>.<Group>") and what decides its lanes. Required.
	Registry registry.Registry
	Engine   *routing.Engine
	// Instance holds the fields of the registration that code sets, as in
	// lanesnats.
	Instance registry.Instance
}

// A Handler handles the messages a Consumer delivers. ctx carries the lane
// of the message. Returning nil acknowledges the message; an error handles
// it again after a delay (WithRetryDelays) until WithMaxDeliver attempts
// failed, then it goes to the group's dead-letter queue. A message is
// delivered again after a consumer died while holding it (Redelivered).
type Handler interface {
	HandleMessage(ctx context.Context, d *Delivery) error
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, d *Delivery) error

// HandleMessage calls f(ctx, d).
func (f HandlerFunc) HandleMessage(ctx context.Context, d *Delivery) error { return f(ctx, d) }

// Delivery is one handling of a message.
type Delivery struct {
	// Lane is the lane of the message ("" the baseline): its x-lane header
	// when that is a valid lane name. It is also the lane of the handler's
	// context.
	Lane string
	// Subject is the routing key it was published with.
	Subject string
	// Body and Headers are the message's.
	Body    []byte
	Headers amqp.Table
	// Attempt counts this consumer's attempts, this one included.
	Attempt int
	// Redelivered: the broker delivered it before, to a consumer that did
	// not acknowledge it (it died, or its lane moved).
	Redelivered bool
	// Msg is the delivery as received. Do not acknowledge it: the Consumer
	// does.
	Msg *amqp.Delivery
}

// Stats counts what a Consumer did.
type Stats struct {
	Handled      uint64 // messages handled and acknowledged (the ack may still wait for the batch it goes in)
	Failed       uint64 // handler errors
	DeadLettered uint64 // messages sent to the dead-letter queue
	Moved        uint64 // messages of a lane moved from the baseline queue to the lane's queue
}

// A Consumer handles the messages of one topic for one consumer group of a
// service, in the lanes the routing engine gives it, each lane's queue with
// manual acks. See the package documentation and docs/mq.md.
type Consumer struct {
	cfg    ConsumerConfig
	o      consumerOptions
	h      Handler
	log    *slog.Logger
	engine *routing.Engine
	m      *mqlane.Member
	inst   registry.Instance
	tracer trace.Tracer

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	runs   *mqlane.Runs // one per lane consumed

	known map[string]bool // lanes; the coordinator's

	mu        sync.Mutex
	announced map[string]bool // lanes written to the index by this consumer
	closeOnce sync.Once
	meta      *amqp.Connection // the coordinator's, for discovery

	handled, failed, deadLettered, moved atomic.Uint64
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
	case cfg.Dial == nil:
		return nil, fmt.Errorf("%w: ConsumerConfig.Dial is required", ErrInvalidOption)
	case cfg.Registry == nil:
		return nil, fmt.Errorf("%w: ConsumerConfig.Registry is required", ErrInvalidOption)
	case cfg.Engine == nil:
		return nil, fmt.Errorf("%w: ConsumerConfig.Engine is required", ErrInvalidOption)
	}
	if err := registry.CheckService(cfg.Service); err != nil {
		return nil, fmt.Errorf("%w: ConsumerConfig.Service: %w", ErrInvalidOption, err)
	}
	for _, f := range []struct{ what, v string }{{"ConsumerConfig.Service", cfg.Service}, {"ConsumerConfig.Group", cfg.Group}, {"ConsumerConfig.Topic", cfg.Topic}} {
		if err := CheckName(f.what, f.v); err != nil {
			return nil, err
		}
	}
	regName := mqlane.RegistryService(cfg.Service, cfg.Group)
	if s := cfg.Instance.Service; s != "" && s != regName {
		return nil, fmt.Errorf("%w: ConsumerConfig.Instance.Service %q: leave it empty (the consumer registers as %q)", ErrInvalidOption, s, regName)
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	c := &Consumer{cfg: cfg, o: o, h: h, engine: cfg.Engine, tracer: lanestrace.Tracer(o.tp), done: make(chan struct{}),
		known: map[string]bool{}, announced: map[string]bool{},
		log: o.log.With("service", cfg.Service, "group", cfg.Group, "topic", cfg.Topic)}
	in := cfg.Instance
	in.Service = regName
	in.Labels = mqlane.Labels(in.Labels, cfg.Service, cfg.Group, cfg.Topic)
	var addr net.Addr
	if cfg.Addr != "" {
		if a, err := net.ResolveTCPAddr("tcp", cfg.Addr); err == nil {
			addr = a
		}
	}
	inst, err := registry.Place(in, o.lane, "", o.getenv, addr)
	if err != nil {
		return nil, fmt.Errorf("lanesamqp: instance: %w", err)
	}
	// The topology first: a broker that cannot be reached fails the start.
	conn, err := cfg.Dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("lanesamqp: dial: %w", err)
	}
	if err := c.declare(conn, inst.Lane); err != nil {
		conn.Close()
		return nil, err
	}
	c.meta = conn
	if c.m, err = mqlane.Join(ctx, cfg.Registry, cfg.Engine, inst, o.ttl); err != nil {
		conn.Close()
		return nil, fmt.Errorf("lanesamqp: %w", err)
	}
	c.inst = c.m.Inst
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.log = c.log.With("id", c.inst.ID, "lane", c.inst.Lane)
	c.runs = mqlane.NewRuns(o.drain, c.log, func(l string) string { return "queue " + Queue(cfg.Topic, cfg.Service, cfg.Group, l) }, c.consume)
	go c.run() // owned by c: Close waits for done
	return c, nil
}

// BrokerAddr returns the host:port of an amqp:// URL, for ConsumerConfig.Addr.
func BrokerAddr(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "5672")
	}
	return u.Host
}

// declare declares the group's topology and lane l's queue on conn, and
// writes l into the group's index.
func (c *Consumer) declare(conn *amqp.Connection, l string) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("lanesamqp: channel: %w", err)
	}
	defer ch.Close()
	l = mqlane.Norm(l)
	if err := declareGroup(ch, c.cfg.Topic, c.cfg.Service, c.cfg.Group, l); err != nil {
		return fmt.Errorf("lanesamqp: %w", err)
	}
	return c.announce(ch, l)
}

// announce writes lane l into the group's index, once per consumer.
func (c *Consumer) announce(ch *amqp.Channel, l string) error {
	if l == "" {
		return nil
	}
	c.mu.Lock()
	done := c.announced[l] || len(c.announced) >= maxIndex
	c.mu.Unlock()
	if done {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	if err := ch.PublishWithContext(ctx, "", indexQueue(c.cfg.Topic, c.cfg.Service, c.cfg.Group), false, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(l)}); err != nil {
		return fmt.Errorf("lanesamqp: index lane %s: %w", l, err)
	}
	c.mu.Lock()
	c.announced[l] = true
	c.mu.Unlock()
	return nil
}

// Instance returns the instance the consumer registered.
func (c *Consumer) Instance() registry.Instance { return c.inst.Clone() }

// Owned returns the lanes whose queues the consumer consumes now, or still
// settles after handing them on, sorted ("" the baseline).
func (c *Consumer) Owned() []string { return c.runs.Owned() }

// Stats returns the consumer's counters.
func (c *Consumer) Stats() Stats {
	return Stats{Handled: c.handled.Load(), Failed: c.failed.Load(), DeadLettered: c.deadLettered.Load(), Moved: c.moved.Load()}
}

// Done is closed once the consumer has stopped.
func (c *Consumer) Done() <-chan struct{} { return c.done }

// Err returns nil while the consumer runs, ErrClosed after Close, or why it
// stopped by itself.
func (c *Consumer) Err() error { return c.runs.Err() }

// Close stops the consumer: it deregisters, stops consuming, waits for the
// messages already received to be handled and acknowledged
// (WithDrainTimeout; what is left goes back to its queue), and waits for
// every goroutine it started. It is safe to call more than once.
func (c *Consumer) Close() error {
	c.closeOnce.Do(func() {
		c.runs.SetErr(ErrClosed)
		c.cancel()
		if err := c.m.Lease.Close(); err != nil && !errors.Is(err, registry.ErrClosed) {
			c.log.Warn("lanes: deregistering the consumer", "err", err)
		}
		<-c.done
	})
	if err := c.Err(); !errors.Is(err, ErrClosed) {
		return err
	}
	return nil
}

// abort stops the consumer as a crash would: nothing more is acknowledged.
func (c *Consumer) abort() {
	c.runs.Abort()
	c.Close()
}

// run is the coordinator (mqlane.Member.Run).
func (c *Consumer) run() {
	defer c.shutdown()
	if err := c.m.Run(c.ctx, c.o.discovery, c.known, maxIndex, c.discover, c.runs.Reconcile); err != nil {
		err = fmt.Errorf("%w: %w", ErrRegistrationLost, err)
		c.log.Error("lanes: consumer registration lost; stopping", "err", err)
		c.runs.SetErr(err)
	}
}

func (c *Consumer) shutdown() {
	c.runs.Close()
	c.mu.Lock()
	if c.meta != nil {
		c.meta.Close()
		c.meta = nil
	}
	c.mu.Unlock()
	c.cancel()
	c.runs.SetErr(ErrClosed)
	close(c.done)
}

// discover reads the group's index of lane queues into the known lanes:
// it takes what the index holds and gives it back.
func (c *Consumer) discover(ctx context.Context) {
	c.mu.Lock()
	conn := c.meta
	c.mu.Unlock()
	if conn == nil || conn.IsClosed() {
		var err error
		dctx, cancel := context.WithTimeout(ctx, apiTimeout)
		conn, err = c.cfg.Dial(dctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				c.log.Warn("lanes: cannot reach the broker to read the lane index", "err", err)
			}
			return
		}
		c.mu.Lock()
		c.meta = conn
		c.mu.Unlock()
	}
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	defer ch.Close()
	idx := indexQueue(c.cfg.Topic, c.cfg.Service, c.cfg.Group)
	var last uint64
	for range maxIndex {
		d, ok, err := ch.Get(idx, false)
		if err != nil || !ok {
			break
		}
		last = d.DeliveryTag
		if l := string(d.Body); lane.Valid(l) && !c.known[l] && len(c.known) < maxIndex {
			c.known[l] = true
		}
	}
	if last != 0 {
		ch.Nack(last, true, true)
	}
}

// delay is the delay after failed attempt n.
func (c *Consumer) delay(n int) time.Duration { return mqlane.Delay(c.o.retryDelays, n) }
