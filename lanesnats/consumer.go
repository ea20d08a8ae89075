package lanesnats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/nats-io/nats.go/jetstream"

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

// ConsumerConfig says what a Consumer consumes and where it registers.
type ConsumerConfig struct {
	// Service is the consuming service, such as "billing". Required.
	Service string
	// Group is the consumer group within the service, such as "invoices":
	// every message of the topic is handled once per group. Required; see
	// CheckGroup.
	Group string
	// Topic is the topic consumed. Required; its stream must exist.
	Topic string
	// Registry is where the consumer registers (under the service
	// "mq.<Service>.<Group>"), with a lease that keeps it alive.
	// Required.
	Registry registry.Registry
	// Engine decides which consumers handle which lane. It must follow
	// Registry (routing.WithRegistry) and, for fallback chains, strict lanes
	// and tag rules, the policy store (routing.WithPolicyStore). Required.
	Engine *routing.Engine
	// Instance holds the fields of the registration that code sets: ID,
	// Lane, Zone, Labels, Version, Host, Addr. Fields left empty come from
	// WithLane, then the LANES_* variables (registry.ApplyEnv). Addr
	// defaults to LANES_ADDR, then to the address of the NATS server the
	// consumer is connected to: a consumer takes no calls, the address only
	// tells where it is reached. Service is set by NewConsumer.
	Instance registry.Instance
}

// A Consumer handles the messages of one topic for one consumer group of a
// service, in the lanes the routing engine gives it: those of its own lane,
// of the lanes that fall back to it, and, for a baseline consumer, the
// baseline and the lanes that no consumer of the group serves. See the
// package documentation and docs/mq.md.
type Consumer struct {
	js      jetstream.JetStream
	stream  jetstream.Stream
	topic   string
	group   string
	service string
	regName string
	dlq     string
	o       consumerOptions
	h       Handler
	log     *slog.Logger
	engine  *routing.Engine
	svc     *routing.Service
	inst    registry.Instance
	tracer  trace.Tracer // nil: no spans
	lease   registry.Lease

	ctx    context.Context // the coordinator's: cancelled by Close
	cancel context.CancelFunc
	done   chan struct{} // closed when the coordinator and every fetcher have exited

	known map[string]bool // lane tokens seen; coordinator only

	mu        sync.Mutex
	fetchers  map[string]*fetcher
	durables  map[string]jetstream.Consumer
	err       error
	closeOnce sync.Once

	handled, failed, deadLettered, ackedAgain atomic.Uint64
}

// Stats counts what a Consumer did.
type Stats struct {
	Handled      uint64 // messages handled and acknowledged
	Failed       uint64 // handler errors (the message is delivered again or dead-lettered)
	DeadLettered uint64 // messages sent to the dead-letter topic
	// AckedAgain counts copies of messages this consumer had handled and
	// acknowledged, delivered again because the ack reached JetStream
	// after AckWait: acknowledged again, not handled.
	AckedAgain uint64
}

// NewConsumer registers a consumer instance of cfg.Service for cfg.Group and
// starts handling the lanes the routing engine gives it, with h. It returns
// once registered; Close stops it.
//
// Options: WithStream, WithAckWait, WithMaxDeliver, WithBatch,
// WithDiscoveryInterval, WithTTL, WithLane, WithEnv,
// WithLogger, WithDeadLetterTopic, WithRetryDelays, WithSyncAck,
// WithDrainTimeout, WithStartTime.
func NewConsumer(ctx context.Context, js jetstream.JetStream, cfg ConsumerConfig, h Handler, opts ...ConsumerOpt) (*Consumer, error) {
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
	case js == nil:
		return nil, fmt.Errorf("%w: nil JetStream", ErrInvalidOption)
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
	if o.stream == "" {
		o.stream = cfg.Topic
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	if o.deadLetter == "" {
		o.deadLetter = DeadLetterTopic(cfg.Topic)
	}
	regName := registryService(cfg.Service, cfg.Group)
	if s := cfg.Instance.Service; s != "" && s != regName {
		return nil, fmt.Errorf("%w: ConsumerConfig.Instance.Service %q: leave it empty (the consumer registers as %q)", ErrInvalidOption, s, regName)
	}
	stream, err := lookupStream(ctx, js, o.stream)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("%w: %q (topic %q): create it first, for example with lanesnats.StreamConfig", ErrStreamNotFound, o.stream, cfg.Topic)
		}
		return nil, fmt.Errorf("lanesnats: stream %q: %w", o.stream, err)
	}
	c := &Consumer{
		js: js, stream: stream, topic: cfg.Topic, group: cfg.Group, service: cfg.Service, regName: regName,
		dlq: o.deadLetter, o: o, h: h, log: o.log.With("service", cfg.Service, "group", cfg.Group, "topic", cfg.Topic),
		engine: cfg.Engine, known: map[string]bool{}, fetchers: map[string]*fetcher{}, durables: map[string]jetstream.Consumer{},
		done: make(chan struct{}), tracer: lanestrace.Tracer(o.tp),
	}
	c.inst, err = c.place(cfg.Instance)
	if err != nil {
		return nil, err
	}
	c.lease, err = cfg.Registry.Register(ctx, c.inst, o.ttl)
	if err != nil {
		return nil, fmt.Errorf("lanesnats: register %s/%s: %w", regName, c.inst.ID, err)
	}
	c.inst = c.lease.Instance()
	c.svc = c.engine.Service(regName)
	if err := c.waitVisible(ctx); err != nil {
		c.lease.Close()
		return nil, err
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.log = c.log.With("id", c.inst.ID, "lane", c.inst.Lane)
	c.log.Info("lanes: consumer registered", "registry_service", regName)
	go c.run() // owned by c: Close waits for done
	return c, nil
}

// apiTimeout bounds one JetStream API request. A request that reaches a
// server as it dies, or a stream whose leader is being elected again, gets
// no answer: asking again after a bound, instead of waiting out the
// caller's context, is what carries a call over a server's crash.
const apiTimeout = 5 * time.Second

// lookupStream returns the stream name, asking again after a request that
// timed out, until ctx is done.
func lookupStream(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, apiTimeout)
		s, err := js.Stream(actx, name)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return s, err
		}
	}
}

// place fills the instance from the options and the environment
// (registry.Place), with the NATS server's address as the default address,
// and adds the consumer's labels.
func (c *Consumer) place(in registry.Instance) (registry.Instance, error) {
	in.Service = c.regName
	in.Labels = mqlane.Labels(in.Labels, c.service, c.group, c.topic)
	var server net.Addr
	if nc := c.js.Conn(); nc != nil {
		if a, err := net.ResolveTCPAddr("tcp", nc.ConnectedAddr()); err == nil {
			server = a
		}
	}
	in, err := registry.Place(in, c.o.lane, "", c.o.getenv, server)
	if err != nil {
		if in.Addr == "" {
			return in, fmt.Errorf("%w: no address to register: set LANES_ADDR or Instance.Addr, or connect to NATS first", ErrInvalidOption)
		}
		return in, fmt.Errorf("lanesnats: instance: %w", err)
	}
	return in, nil
}

// waitVisible waits until the engine sees this instance: an engine that
// does not follow the registry would never give the consumer a lane.
func (c *Consumer) waitVisible(ctx context.Context) error {
	if err := mqlane.WaitVisible(ctx, c.svc, c.inst.ID); err != nil {
		if errors.Is(err, mqlane.ErrNotVisible) {
			return fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
		return fmt.Errorf("lanesnats: %w", err)
	}
	return nil
}

// Instance returns the instance the consumer registered.
func (c *Consumer) Instance() registry.Instance { return c.inst.Clone() }

// Owned returns the lane tokens whose messages the consumer fetches now,
// sorted: lane names, BaselineToken for the baseline, and any foreign token
// that is not a lane name (handled as baseline). A lane handed over to
// another consumer is listed until this one has drained its iterator
// (a round trip to the server); it may still be handling what it received.
func (c *Consumer) Owned() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for tok, f := range c.fetchers {
		if f.isFetching() {
			out = append(out, tok)
		}
	}
	sort.Strings(out)
	return out
}

// Stats returns the consumer's counters.
func (c *Consumer) Stats() Stats {
	return Stats{Handled: c.handled.Load(), Failed: c.failed.Load(), DeadLettered: c.deadLettered.Load(), AckedAgain: c.ackedAgain.Load()}
}

// Done is closed once the consumer has stopped: after Close, or when its
// registration was lost (Err tells which).
func (c *Consumer) Done() <-chan struct{} { return c.done }

// Err returns nil while the consumer runs, ErrClosed after Close, or why it
// stopped by itself (an error wrapping ErrRegistrationLost).
func (c *Consumer) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *Consumer) setErr(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
	}
}

// Close stops the consumer: it deregisters the instance, so that the other
// consumers take its lanes over, stops fetching, waits for the messages it
// already fetched to be handled and acknowledged (WithDrainTimeout), and
// waits for every goroutine it started. It returns the error that stopped
// the consumer before Close, if any. It is safe to call more than once.
func (c *Consumer) Close() error {
	c.closeOnce.Do(func() {
		c.setErr(ErrClosed)
		c.cancel()
		if err := c.lease.Close(); err != nil && !errors.Is(err, registry.ErrClosed) {
			c.log.Warn("lanes: deregistering the consumer", "err", err)
		}
		<-c.done
	})
	if err := c.Err(); !errors.Is(err, ErrClosed) {
		return err
	}
	return nil
}

// run is the coordinator: it decides which lanes the consumer fetches,
// again whenever the instances, the policy or the stream's lanes change, and
// stops everything when the consumer stops.
func (c *Consumer) run() {
	defer c.shutdown()
	disc := time.NewTimer(0)
	defer disc.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		changed, polChanged := c.svc.Changed(), c.engine.PolicyChanged()
		if !c.reconcile() {
			retry.Reset(time.Second)
		}
		for dirty := false; !dirty; {
			select {
			case <-c.ctx.Done():
				return
			case <-c.lease.Done():
				if c.ctx.Err() != nil {
					return
				}
				err := fmt.Errorf("%w: %s/%s: %v", ErrRegistrationLost, c.regName, c.inst.ID, c.lease.Err())
				c.log.Error("lanes: consumer registration lost; stopping", "err", err)
				c.setErr(err)
				return
			case <-changed:
				dirty = true
			case <-disc.C:
				c.discover()
				disc.Reset(c.o.discovery)
				dirty = true // also catches time-driven changes, such as a lane's expiry
			case <-retry.C:
				dirty = true
			case <-polChanged:
				dirty = true
			}
		}
	}
}

// shutdown stops every fetcher, waits for them to drain (each within the
// drain timeout), flushes the acks and marks the consumer done.
func (c *Consumer) shutdown() {
	c.mu.Lock()
	fs := make([]*fetcher, 0, len(c.fetchers))
	for _, f := range c.fetchers {
		fs = append(fs, f)
	}
	c.mu.Unlock()
	for _, f := range fs {
		f.stop()
	}
	for _, f := range fs {
		<-f.done
	}
	if nc := c.js.Conn(); nc != nil && nc.IsConnected() {
		nc.FlushTimeout(5 * time.Second)
	}
	c.cancel()
	c.setErr(ErrClosed)
	close(c.done)
}

// reconcile starts fetching the lanes the consumer owns and stops fetching
// the others. It returns false when a durable consumer could not be set up
// and it must be tried again.
func (c *Consumer) reconcile() bool {
	me := c.self()
	want := map[string]bool{}
	for tok := range c.candidates() {
		if me != nil && c.owns(tok, me) {
			want[tok] = true
		}
	}
	c.mu.Lock()
	for tok, f := range c.fetchers {
		if f.finished() {
			delete(c.fetchers, tok)
			continue
		}
		if !want[tok] {
			if f.stop() {
				c.log.Info("lanes: lane released", "token", tok)
			}
		}
	}
	var start []string
	for tok := range want {
		if f := c.fetchers[tok]; f != nil && f.revive() {
			continue
		}
		start = append(start, tok)
	}
	c.mu.Unlock()
	ok := true
	sort.Strings(start)
	for _, tok := range start {
		cons, err := c.durable(tok)
		if err != nil {
			if c.ctx.Err() == nil {
				c.log.Warn("lanes: cannot set up the durable consumer of a lane; retrying", "token", tok, "err", err)
			}
			ok = false
			continue
		}
		c.mu.Lock()
		if c.ctx.Err() != nil {
			c.mu.Unlock()
			return true
		}
		// The token's previous fetcher, if any, finishes its messages
		// first: order per lane.
		f := c.newFetcher(tok, cons, c.fetchers[tok])
		c.fetchers[tok] = f
		c.mu.Unlock()
		c.log.Info("lanes: lane owned", "token", tok, "consumer", consumerName(c.group, tok))
	}
	return ok
}

// self returns this instance as the engine sees it (with the policy's
// effective lane applied by LaneOf where needed), or nil while it is not
// visible.
func (c *Consumer) self() *registry.Instance { return mqlane.Self(c.svc, c.inst.ID) }

// candidates returns the lane tokens the consumer may have to fetch: the
// baseline, the lanes discovered in the stream (foreign tokens included),
// and the lanes of the group's instances (mqlane.Candidates).
func (c *Consumer) candidates() map[string]bool {
	out := make(map[string]bool, len(c.known)+2)
	for tok := range c.known {
		out[tok] = true
	}
	for l := range mqlane.Candidates(c.engine, c.svc, nil) {
		out[laneToken(l)] = true
	}
	return out
}

// owns decides whether this instance (me, as the engine sees it) fetches the
// messages of lane token tok (mqlane.Owns); tokens that are not lane names
// belong to the baseline consumers.
func (c *Consumer) owns(tok string, me *registry.Instance) bool {
	l, _ := tokenLane(tok) // a foreign token is handled as baseline
	return mqlane.Owns(c.engine, c.svc, me, l)
}

// discover adds the lane tokens of the stream's subjects to the known ones.
func (c *Consumer) discover() {
	ctx, cancel := context.WithTimeout(c.ctx, apiTimeout)
	defer cancel()
	info, err := c.stream.Info(ctx, jetstream.WithSubjectFilter(c.topic+".*.>"))
	if err != nil {
		if c.ctx.Err() == nil {
			c.log.Warn("lanes: cannot list the lanes of the stream", "err", err)
		}
		return
	}
	for subj := range info.State.Subjects {
		if tok, _, ok := splitSubject(c.topic, subj); ok && !c.known[tok] {
			c.known[tok] = true
			c.log.Debug("lanes: lane discovered", "token", tok)
		}
	}
}

// durable returns the durable consumer of lane token tok, creating it when
// missing. It is never deleted: its cursor is what hands a lane from one
// consumer to the next without losing or repeating messages.
func (c *Consumer) durable(tok string) (jetstream.Consumer, error) {
	c.mu.Lock()
	d := c.durables[tok]
	c.mu.Unlock()
	if d != nil {
		return d, nil
	}
	ctx, cancel := context.WithTimeout(c.ctx, apiTimeout)
	defer cancel()
	name := consumerName(c.group, tok)
	d, err := c.stream.Consumer(ctx, name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		d, err = c.stream.CreateConsumer(ctx, c.consumerConfig(tok))
		if errors.Is(err, jetstream.ErrConsumerExists) {
			d, err = c.stream.Consumer(ctx, name)
		}
	}
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.durables[tok] = d
	c.mu.Unlock()
	return d, nil
}

// forget drops the cached durable of tok, so that the next fetcher looks it
// up (or creates it) again.
func (c *Consumer) forget(tok string) {
	c.mu.Lock()
	delete(c.durables, tok)
	c.mu.Unlock()
}

// consumerConfig is the configuration of the durable consumer of tok.
func (c *Consumer) consumerConfig(tok string) jetstream.ConsumerConfig {
	l, ok := tokenLane(tok)
	what := "lane " + l
	switch {
	case !ok:
		what = "foreign token " + tok + " (as baseline)"
	case l == "":
		what = "the baseline"
	}
	cfg := jetstream.ConsumerConfig{
		Durable:       consumerName(c.group, tok),
		Description:   fmt.Sprintf("lanes: group %s of service %s, %s", c.group, c.service, what),
		FilterSubject: laneFilter(c.topic, tok),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.o.ackWait,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		// No MaxDeliver: JetStream would silently stop delivering; lanes
		// dead-letters the message itself after WithMaxDeliver deliveries.
		MaxDeliver: -1,
	}
	if !c.o.startTime.IsZero() {
		t := c.o.startTime
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
	return cfg
}

// delay is the delay before the next delivery of a message that failed on
// delivery n.
func (c *Consumer) delay(n uint64) time.Duration {
	d := c.o.retryDelays
	if n == 0 {
		n = 1
	}
	if n > uint64(len(d)) {
		return d[len(d)-1]
	}
	return d[n-1]
}

// laneCtx returns the handlers' context in lane l.
func (c *Consumer) laneCtx(l string) context.Context { return lane.WithLane(context.Background(), l) }
