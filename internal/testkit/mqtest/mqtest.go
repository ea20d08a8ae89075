// Package mqtest is the conformance suite of the message-queue backends
// (lanesnats, laneskafka, lanesamqp): every backend must pass Run. It holds
// them to the contract of docs/mq.md:
//
//   - a message published in lane L carries L: the handler's context is in
//     lane L, the message has the x-lane and baggage headers and the
//     producer's trace context, and the consumer span names both lanes;
//   - the consumers of lane L handle it when lane L has a live consumer of
//     the group; otherwise the fallback chain decides, ending at the
//     baseline; a baseline message never reaches a lane consumer;
//   - when a lane's consumer stops, is killed (its connection closed
//     without goodbye) or its lane expires, its pending messages are handed
//     on along the chain: none is lost; a message is handled twice only when
//     its consumer was killed while holding it.
//
// The suite drives a Backend: it publishes in a lane, starts, stops and
// kills consumers of a group in a lane, and observes what they handle.
package mqtest

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanestrace"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// Timeout bounds every wait of the suite.
const Timeout = 60 * time.Second

// Env is what the suite gives a backend for one subtest.
type Env struct {
	// Topic is a topic name new to the broker: 1 to 40 characters of a-z
	// and 0-9.
	Topic string
	// Registry, Engine: where consumers register, and the engine that
	// decides their lanes (it follows Registry and the policy).
	Registry registry.Registry
	Engine   *routing.Engine
	// TracerProvider traces publishes and deliveries; the suite reads the
	// spans.
	TracerProvider trace.TracerProvider
}

// Handled is one message handled by a consumer.
type Handled struct {
	// ID is the message's data, as published.
	ID string
	// Lane is the lane the backend says the message is in; CtxLane the lane
	// of the handler's context.
	Lane, CtxLane string
	// Header is the message's headers, as the handler sees them; keys are
	// matched without regard to case.
	Header map[string][]string
	// TraceID is the trace of the handler's context.
	TraceID trace.TraceID
}

// A Handle is called by a consumer for each message, in the handler; the
// handler returns (and the message is acknowledged) once it returns.
type Handle func(ctx context.Context, h Handled)

// Spec says which consumer to start.
type Spec struct {
	Service, Group string
	Lane           string // "" for the baseline
	ID             string // the instance id, unique in the subtest
}

// Backend is one message-queue backend, on one topic, for one subtest.
type Backend interface {
	// Publish publishes a message whose data is id in the lane of ctx, and
	// returns once the broker has stored it.
	Publish(ctx context.Context, id string) error
	// Start starts a consumer of spec.Group of spec.Service in spec.Lane
	// that calls handle for each message, and returns once it is
	// registered.
	Start(ctx context.Context, spec Spec, handle Handle) (Consumer, error)
}

// Consumer is a consumer the suite started.
type Consumer interface {
	// Stop stops the consumer gracefully: it deregisters, finishes what it
	// holds and acknowledges it.
	Stop() error
	// Kill stops it without goodbye: its connections to the broker are
	// closed abruptly, nothing it holds is acknowledged, and its
	// registration goes as an expired lease would. Handlers still running
	// must not acknowledge anything. Kill returns once the consumer's
	// goroutines have exited.
	Kill()
	// Owned returns the lanes the consumer consumes now (lane names; the
	// baseline as the backend spells it).
	Owned() []string
}

// NewBackend makes the backend of one subtest.
type NewBackend func(t *testing.T, env Env) Backend

var topicSeq atomic.Int64

// Run runs the suite as subtests of t.
func Run(t *testing.T, newBackend NewBackend) {
	tests := []struct {
		name string
		fn   func(s *suite)
	}{
		{"LaneCarried", testLaneCarried},
		{"BaselineNeverInLane", testBaselineNeverInLane},
		{"UnservedLaneToBaseline", testUnservedLaneToBaseline},
		{"FallbackChain", testFallbackChain},
		{"StrictLaneWaits", testStrictLaneWaits},
		{"HandOffOnStop", testHandOffOnStop},
		{"HandOffOnKill", testHandOffOnKill},
		{"HandOffOnExpiry", testHandOffOnExpiry},
		{"LaneComesBack", testLaneComesBack},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSuite(t)
			s.b = newBackend(t, s.env)
			tc.fn(s)
		})
	}
}

// suite is the state of one subtest.
type suite struct {
	t   *testing.T
	env Env
	b   Backend
	pol *policy.Memory
	rec *tracetest.SpanRecorder

	mu      sync.Mutex
	handled map[string][]got // by message id
	changed chan struct{}    // capacity 1: something was handled
}

// got is one handling of a message, by the consumer spec.
type got struct {
	Handled
	by Spec
	at time.Time
}

func newSuite(t *testing.T) *suite {
	reg := registry.NewMemory()
	pol := policy.NewMemory()
	eng := routing.New(routing.WithRegistry(reg), routing.WithPolicyStore(pol))
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() {
		eng.Close()
		reg.Close()
		tp.Shutdown(context.Background())
	})
	<-eng.PolicyReady()
	topic := fmt.Sprintf("mqt%d%d", time.Now().UnixNano()%1e6, topicSeq.Add(1))
	return &suite{t: t, pol: pol, rec: rec, handled: map[string][]got{}, changed: make(chan struct{}, 1),
		env: Env{Topic: topic, Registry: reg, Engine: eng, TracerProvider: tp}}
}

func (s *suite) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	s.t.Cleanup(cancel)
	return ctx
}

// setPolicy puts a policy document and waits for the engine to apply it.
func (s *suite) setPolicy(doc string) {
	s.t.Helper()
	changed := s.env.Engine.PolicyChanged()
	if _, err := s.pol.Put(s.ctx(), []byte(doc)); err != nil {
		s.t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(Timeout):
		s.t.Fatal("the engine did not apply the policy")
	}
}

// start starts a consumer in lane l with id; hold, when not nil, is
// called in the handler before the message counts as handled: it blocks
// the handler.
func (s *suite) start(id, l string, hold func(ctx context.Context, h Handled)) Consumer {
	s.t.Helper()
	c, err := s.tryStart(id, l, hold)
	if err != nil {
		s.t.Fatalf("start consumer %s in lane %q: %v", id, l, err)
	}
	return c
}

// tryStart is start, returning the error.
func (s *suite) tryStart(id, l string, hold func(ctx context.Context, h Handled)) (Consumer, error) {
	spec := Spec{Service: "billing", Group: "invoices", Lane: l, ID: id}
	c, err := s.b.Start(s.ctx(), spec, func(ctx context.Context, h Handled) {
		if hold != nil {
			hold(ctx, h)
		}
		s.record(got{Handled: h, by: spec, at: time.Now()})
	})
	if err != nil {
		return nil, err
	}
	stopped := false
	s.t.Cleanup(func() {
		if !stopped {
			c.Stop()
		}
	})
	return stoppable{c, &stopped}, nil
}

type stoppable struct {
	Consumer
	stopped *bool
}

func (c stoppable) Stop() error { *c.stopped = true; return c.Consumer.Stop() }
func (c stoppable) Kill()       { *c.stopped = true; c.Consumer.Kill() }

func (s *suite) record(g got) {
	s.mu.Lock()
	s.handled[g.ID] = append(s.handled[g.ID], g)
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// publish publishes n messages in lane l, with ids "<prefix>-<i>".
func (s *suite) publish(l, prefix string, n int) []string {
	s.t.Helper()
	ids := make([]string, n)
	ctx := lane.WithLane(s.ctx(), l)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%d", prefix, i)
		if err := s.b.Publish(ctx, ids[i]); err != nil {
			s.t.Fatalf("publish %s in lane %q: %v", ids[i], l, err)
		}
	}
	return ids
}

// wait waits until every id is handled, and returns the handlings of each.
func (s *suite) wait(ids []string) map[string][]got {
	s.t.Helper()
	deadline := time.After(Timeout)
	for {
		s.mu.Lock()
		missing := 0
		out := make(map[string][]got, len(ids))
		for _, id := range ids {
			if len(s.handled[id]) == 0 {
				missing++
			}
			out[id] = append([]got(nil), s.handled[id]...)
		}
		s.mu.Unlock()
		if missing == 0 {
			return out
		}
		select {
		case <-s.changed:
		case <-deadline:
			s.t.Fatalf("%d of %d messages not handled after %v; handled so far:\n%s", missing, len(ids), Timeout, s.summary())
		}
	}
}

// summary lists who handled what, for failure messages.
func (s *suite) summary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var lines []string
	for id, gs := range s.handled {
		for _, g := range gs {
			lines = append(lines, fmt.Sprintf("  %s (lane %q) by %s (lane %q)", id, g.Lane, g.by.ID, g.by.Lane))
		}
	}
	sort.Strings(lines)
	if len(lines) > 40 {
		lines = append(lines[:40], fmt.Sprintf("  ... %d more", len(lines)-40))
	}
	return strings.Join(lines, "\n")
}

// expectBy checks that every id was handled, in lane msgLane, only by
// consumers in lane by; once each unless dups allows it.
func (s *suite) expectBy(ids []string, msgLane, by string, dups bool) {
	s.t.Helper()
	for id, gs := range s.wait(ids) {
		for _, g := range gs {
			if g.by.Lane != by {
				s.t.Errorf("message %s of lane %q handled by %s of lane %q, want a consumer of lane %q", id, msgLane, g.by.ID, g.by.Lane, by)
			}
			if g.Lane != msgLane || g.CtxLane != msgLane {
				s.t.Errorf("message %s published in lane %q delivered in lane %q, handler context in %q", id, msgLane, g.Lane, g.CtxLane)
			}
		}
		if len(gs) > 1 && !dups {
			s.t.Errorf("message %s handled %d times", id, len(gs))
		}
	}
}

// waitFor waits until cond holds, re-checking whenever a message is handled
// and at least every 50ms (for changes that handle nothing).
func (s *suite) waitFor(what string, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(Timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out after %v waiting for %s", Timeout, what)
		}
		select {
		case <-s.changed:
		case <-tick.C:
		}
	}
}

func testLaneCarried(s *suite) {
	s.start("base", "", nil)
	s.start("alice", "alice", nil)
	tr := s.env.TracerProvider.Tracer("mqtest")
	ctx, parent := tr.Start(lane.WithLane(s.ctx(), "alice"), "caller")
	if err := s.b.Publish(ctx, "m"); err != nil {
		s.t.Fatal(err)
	}
	parent.End()
	s.expectBy([]string{"m"}, "alice", "alice", false)
	g := s.wait([]string{"m"})["m"][0]
	if v := header(g.Header, lane.Header); v != "alice" {
		s.t.Errorf("%s header %q, want alice", lane.Header, v)
	}
	if v := header(g.Header, lane.BaggageHeader); !strings.Contains(v, lane.BaggageKey+"=alice") {
		s.t.Errorf("%s header %q, want the member %s=alice", lane.BaggageHeader, v, lane.BaggageKey)
	}
	if g.TraceID != parent.SpanContext().TraceID() {
		s.t.Errorf("handler's trace %s, want the publisher's %s", g.TraceID, parent.SpanContext().TraceID())
	}
	// The consumer span: what the trace collector's integrity check reads.
	s.waitFor("the consumer span", func() bool {
		for _, sp := range s.rec.Ended() {
			if sp.SpanKind() != trace.SpanKindConsumer {
				continue
			}
			attrs := map[string]string{}
			for _, a := range sp.Attributes() {
				attrs[string(a.Key)] = a.Value.AsString()
			}
			if attrs[string(lanestrace.Requested)] == "alice" && attrs[string(lanestrace.ConsumerLane)] == "alice" &&
				sp.SpanContext().TraceID() == parent.SpanContext().TraceID() {
				return true
			}
		}
		return false
	})
}

func testBaselineNeverInLane(s *suite) {
	s.start("base", "", nil)
	s.start("alice", "alice", nil)
	s.start("team-a", "team-a", nil)
	s.expectBy(s.publish("", "b", 20), "", "", false)
	s.expectBy(s.publish("alice", "a", 5), "alice", "alice", false)
}

func testUnservedLaneToBaseline(s *suite) {
	s.start("base", "", nil)
	s.start("alice", "alice", nil)
	s.expectBy(s.publish("bob", "b", 5), "bob", "", false)
}

func testFallbackChain(s *suite) {
	s.setPolicy("lanes:\n  alice:\n    fallback: [team-a]\n")
	s.start("base", "", nil)
	s.start("team-a", "team-a", nil)
	s.expectBy(s.publish("alice", "a", 5), "alice", "team-a", false)
}

func testStrictLaneWaits(s *suite) {
	s.setPolicy("lanes:\n  secret:\n    strict: true\n")
	s.start("base", "", nil)
	held := s.publish("secret", "s", 3)
	// A lane nobody serves, published after the strict one: once the
	// baseline has it, it has seen the strict lane's messages too.
	s.expectBy(s.publish("bob", "b", 1), "bob", "", false)
	s.mu.Lock()
	for _, id := range held {
		if len(s.handled[id]) > 0 {
			s.t.Errorf("the strict lane's message %s was handled by %s", id, s.handled[id][0].by.ID)
		}
	}
	s.mu.Unlock()
	s.start("secret", "secret", nil)
	s.expectBy(held, "secret", "secret", false)
}

func testHandOffOnStop(s *suite) {
	s.start("base", "", nil)
	a := s.start("alice", "alice", nil)
	s.expectBy(s.publish("alice", "a1", 10), "alice", "alice", false)
	if err := a.Stop(); err != nil {
		s.t.Fatalf("Stop: %v", err)
	}
	s.expectBy(s.publish("alice", "a2", 10), "alice", "", false)
}

func testHandOffOnKill(s *suite) {
	s.start("base", "", nil)
	entered := make(chan string, 100)
	release := make(chan struct{})
	a := s.start("alice", "alice", func(ctx context.Context, h Handled) {
		if h.CtxLane != "alice" {
			return
		}
		select {
		case entered <- h.ID:
		default:
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
	})
	ids := s.publish("alice", "k", 5)
	var first string
	select {
	case first = <-entered:
	case <-time.After(Timeout):
		s.t.Fatal("the alice consumer handled nothing")
	}
	// The alice consumer holds a message in its handler: kill it.
	a.Kill()
	close(release)
	got := s.wait(ids)
	for id, gs := range got {
		var byBase int
		for _, g := range gs {
			if g.by.Lane == "" {
				byBase++
			}
		}
		if byBase == 0 {
			s.t.Errorf("message %s was not handed on to the baseline: %d handlings", id, len(gs))
		}
		if len(gs) > 1 && id != first {
			// Only what the killed consumer held may come twice; it held
			// one in its handler and may have handled none.
			s.t.Logf("message %s handled %d times", id, len(gs))
		}
	}
	s.expectBy(s.publish("alice", "k2", 5), "alice", "", false)
}

func testHandOffOnExpiry(s *suite) {
	s.start("base", "", nil)
	a := s.start("alice", "alice", nil)
	s.expectBy(s.publish("alice", "a1", 5), "alice", "alice", false)
	s.setPolicy("lanes:\n  alice:\n    expires: 2000-01-01T00:00:00Z\n")
	s.handedTo("alice", "", a)
	s.expectBy(s.publish("alice", "a2", 5), "alice", "", false)
}

func testLaneComesBack(s *suite) {
	base := s.start("base", "", nil)
	s.expectBy(s.publish("alice", "a1", 5), "alice", "", false)
	s.start("alice", "alice", nil)
	s.handedTo("alice", "alice", base)
	s.expectBy(s.publish("alice", "a2", 5), "alice", "alice", false)
}

// handedTo waits until lane l's messages reach the consumers of lane by,
// and from, the lane's previous owner, no longer consumes it: handing a
// lane over takes a moment, so it publishes probes until one is handled
// there. The callers then check that every later message is.
func (s *suite) handedTo(l, by string, from Consumer) {
	s.t.Helper()
	var n int
	s.waitFor(fmt.Sprintf("a message of lane %q handled by a consumer of lane %q", l, by), func() bool {
		id := fmt.Sprintf("probe-%s-%d", l, n)
		n++
		if err := s.b.Publish(lane.WithLane(s.ctx(), l), id); err != nil {
			s.t.Fatal(err)
		}
		gs := s.wait([]string{id})[id]
		return gs[0].by.Lane == by
	})
	s.waitFor(fmt.Sprintf("the previous owner of lane %q to release it", l), func() bool {
		return !slices.Contains(from.Owned(), l)
	})
}

// header returns the first value of the header key, matched without regard
// to case (NATS keeps keys as written, AMQP and Kafka too).
func header(h map[string][]string, key string) string {
	for k, v := range h {
		if strings.EqualFold(k, key) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}
