package lanesnats_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lanesdev/lanes/internal/testkit/natstest"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesnats"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// TestPublishStamps: the publisher puts the lane of the context in the
// subject and in the x-lane and baggage headers, removes stale lane headers
// from a baseline message, treats an invalid lane as the baseline, keeps the
// caller's Nats-Msg-Id (a republish is stored once) or makes one with
// WithMsgIDs, and leaves the caller's message alone.
func TestPublishStamps(t *testing.T) {
	e := newEnv(t, natstest.Embedded(t), "")
	ctx := context.Background()
	get := func(seq uint64) *jetstream.RawStreamMsg {
		t.Helper()
		s, err := e.js.Stream(ctx, e.topic)
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}

	in := &nats.Msg{Subject: "eu.created", Data: []byte("x"), Header: nats.Header{"baggage": {"k=v, lane=old"}, "x-lane": {"old"}}}
	ack, err := e.pub.PublishMsg(lane.WithLane(ctx, "alice"), in)
	if err != nil {
		t.Fatal(err)
	}
	m := get(ack.Sequence)
	if m.Subject != "orders.alice.eu.created" {
		t.Errorf("subject %q", m.Subject)
	}
	if got := lane.MessageHeader(m.Header).Get("x-lane"); got != "alice" {
		t.Errorf("x-lane %q", got)
	}
	if got := lane.MessageHeader(m.Header).Get("baggage"); got != "lane=alice,k=v" {
		t.Errorf("baggage %q", got)
	}
	if m.Header.Get(lanesnats.MsgIDHeader) != "" {
		t.Error("a Nats-Msg-Id without WithMsgIDs")
	}
	if in.Subject != "eu.created" || in.Header.Get("x-lane") != "old" || len(in.Header) != 2 {
		t.Errorf("the caller's message was modified: %+v", in)
	}

	// Baseline: stale lane headers go, other baggage stays; the lane token
	// is "_".
	ack, err = e.pub.PublishMsg(ctx, in, jetstream.WithMsgID("my-id"))
	if err != nil {
		t.Fatal(err)
	}
	m = get(ack.Sequence)
	if m.Subject != "orders._.eu.created" || m.Header.Get("x-lane") != "" || lane.MessageHeader(m.Header).Get("baggage") != "k=v" {
		t.Errorf("baseline: %q %v", m.Subject, m.Header)
	}
	if got := m.Header.Get(lanesnats.MsgIDHeader); got != "my-id" {
		t.Errorf("Nats-Msg-Id %q, want the caller's", got)
	}
	// The same id again is stored once.
	ack2, err := e.pub.PublishMsg(ctx, in, jetstream.WithMsgID("my-id"))
	if err != nil || !ack2.Duplicate || ack2.Sequence != ack.Sequence {
		t.Errorf("republish: %+v %v", ack2, err)
	}

	// An invalid lane in the context is the baseline; a lane that is not
	// normalised is normalised.
	ack, err = e.pub.Publish(lane.WithLane(ctx, "Not Valid!"), "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	if m = get(ack.Sequence); m.Subject != "orders._.x" || m.Header.Get("x-lane") != "" {
		t.Errorf("invalid lane: %q %v", m.Subject, m.Header)
	}
	ack, err = e.pub.Publish(lane.WithLane(ctx, " Bob "), "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	if m = get(ack.Sequence); m.Subject != "orders.bob.x" {
		t.Errorf("lane not normalised: %q", m.Subject)
	}

	// Async publishing stamps the same way.
	f, err := e.pub.PublishMsgAsync(lane.WithLane(ctx, "carol"), &nats.Msg{Subject: "y"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-f.Ok():
		if m = get(a.Sequence); m.Subject != "orders.carol.y" || m.Header.Get("x-lane") != "carol" {
			t.Errorf("async: %q %v", m.Subject, m.Header)
		}
	case err := <-f.Err():
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("no pub ack")
	}

	auto, err := lanesnats.NewPublisher(e.js, e.topic, lanesnats.WithMsgIDs())
	if err != nil {
		t.Fatal(err)
	}
	ack, err = auto.Publish(ctx, "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	if m = get(ack.Sequence); m.Header.Get(lanesnats.MsgIDHeader) == "" {
		t.Error("WithMsgIDs: no Nats-Msg-Id")
	}

	for _, bad := range []string{"", "a..b", ".a", "a.", "a.*", ">", "a b"} {
		if _, err := e.pub.Publish(ctx, bad, nil); !errors.Is(err, lanesnats.ErrInvalidSubject) {
			t.Errorf("subject %q: %v", bad, err)
		}
	}
	for _, bad := range []string{"", "a.b", "a b", "a*", strings.Repeat("x", 65)} {
		if _, err := lanesnats.NewPublisher(e.js, bad); !errors.Is(err, lanesnats.ErrInvalidTopic) {
			t.Errorf("topic %q: %v", bad, err)
		}
	}
}

// TestSubjectsAndNames: the wire format is stable.
func TestSubjectsAndNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{lanesnats.Subject("orders", "alice", "created"), "orders.alice.created"},
		{lanesnats.Subject("orders", "", "eu.created"), "orders._.eu.created"},
		{lanesnats.Subject("orders", "Alice", "x"), "orders.alice.x"},
		{lanesnats.Subject("orders", "no good", "x"), "orders._.x"},
		{lanesnats.ConsumerName("invoices", "alice"), "invoices_alice"},
		{lanesnats.ConsumerName("invoices", "_"), "invoices__"},
		{lanesnats.RegistryService("billing", "invoices"), "mq.billing.invoices"},
		{lanesnats.DeadLetterTopic("orders"), "orders-dlq"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	if n := lanesnats.ConsumerName("invoices", "Bad_Lane"); !strings.HasPrefix(n, "invoices__x") {
		t.Errorf("foreign token: %q", n)
	}
	if err := lanesnats.CheckGroup("a_b"); !errors.Is(err, lanesnats.ErrInvalidGroup) {
		t.Errorf("group with '_': %v", err)
	}
}

// TestHandlerContextLane: a lane consumer handles its lane's messages with
// the lane in the handler's context, and what the handler publishes with
// that context stays in the lane; the baseline consumer handles the
// baseline. Run on each kind of NATS server.
func TestHandlerContextLane(t *testing.T) {
	natstest.Each(t, func(t *testing.T, srv natstest.Server) {
		e := newEnv(t, srv, "")
		r := newRecorder()
		replies, err := lanesnats.NewPublisher(e.js, "replies")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.js.CreateStream(context.Background(), lanesnats.StreamConfig("replies")); err != nil {
			t.Fatal(err)
		}
		h := func(who string) lanesnats.Handler {
			rec := r.handler(who)
			return lanesnats.HandlerFunc(func(ctx context.Context, d *lanesnats.Delivery) error {
				if _, err := replies.Publish(ctx, "done", d.Data); err != nil {
					return err
				}
				return rec.HandleMessage(ctx, d)
			})
		}
		alice := e.consumer("alice-1", "alice", h("alice-1"))
		base := e.consumer("base-1", "", h("base-1"))
		waitOwned(t, alice, "alice")
		waitOwned(t, base, "_")
		e.publish("alice", "created", 5)
		e.publish("", "created", 5)
		gs := r.wait(t, 10, 10*time.Second)
		for _, g := range gs {
			want := map[string]string{"alice": "alice-1", "": "base-1"}[g.lane]
			if g.who != want || g.ctxLane != g.lane || g.subject != "created" || !strings.HasPrefix(g.data, g.lane+"/") || g.n != 1 || g.seq == 0 {
				t.Errorf("delivery %+v", g)
			}
		}
		// The handlers' publishes kept the lane.
		s, _ := e.js.Stream(context.Background(), "replies")
		info, err := s.Info(context.Background(), jetstream.WithSubjectFilter(">"))
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Subjects["replies.alice.done"] != 5 || info.State.Subjects["replies._.done"] != 5 {
			t.Errorf("replies by subject: %v", info.State.Subjects)
		}
		// A handling counts once its ack is sent, after the handler (and
		// so the recorder) returned: wait for the count, then check that
		// it is alice's five messages and no more.
		waitFor(t, 10*time.Second, "alice's handlings counted", func() bool { return alice.Stats().Handled >= 5 })
		if st := alice.Stats(); st.Handled != 5 {
			t.Errorf("alice stats %+v", st)
		}
		in := alice.Instance()
		if in.Service != "mq.billing.invoices" || in.Lane != "alice" || in.Labels[lanesnats.LabelGroup] != "invoices" || registry.CheckAddr(in.Addr) != nil {
			t.Errorf("registered %+v", in)
		}
	})
}

// TestFallbackChain: lane alice falls back to team-a. With no alice
// consumer, the team-a consumer handles alice's messages; a lane outside any
// chain (bob) goes to the baseline, and baseline messages never reach a lane
// consumer. When an alice consumer appears it takes its lane over.
func TestFallbackChain(t *testing.T) {
	natstest.Each(t, func(t *testing.T, srv natstest.Server) {
		e := newEnv(t, srv, "lanes:\n  alice:\n    fallback: [team-a]\n")
		r := newRecorder()
		teamA := e.consumer("team-a-1", "team-a", r.handler("team-a-1"))
		base := e.consumer("base-1", "", r.handler("base-1"))
		e.publish("alice", "x", 5)
		e.publish("bob", "x", 5)
		e.publish("", "x", 5)
		e.publish("team-a", "x", 5)
		gs := r.wait(t, 20, 10*time.Second)
		want := map[string]int{"team-a-1 alice": 5, "team-a-1 team-a": 5, "base-1 bob": 5, "base-1 ": 5}
		if got := byWho(gs); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("handled %v, want %v", got, want)
		}
		waitOwned(t, teamA, "alice", "team-a")
		waitOwned(t, base, "_", "bob")

		alice := e.consumer("alice-1", "alice", r.handler("alice-1"))
		waitOwned(t, alice, "alice")
		waitOwned(t, teamA, "team-a")
		e.publish("alice", "y", 5)
		gs = r.wait(t, 25, 10*time.Second)
		for _, g := range gs[20:] {
			if g.who != "alice-1" {
				t.Errorf("after alice joined: %+v", g)
			}
		}
	})
}

// TestStrictLaneWaits: the messages of a strict lane with no consumer wait
// (the baseline does not take them) until a consumer of the lane comes.
func TestStrictLaneWaits(t *testing.T) {
	natstest.Each(t, func(t *testing.T, srv natstest.Server) {
		e := newEnv(t, srv, "lanes:\n  secret:\n    strict: true\n")
		r := newRecorder()
		base := e.consumer("base-1", "", r.handler("base-1"))
		e.publish("secret", "x", 5)
		e.publish("", "x", 1)
		// A lane nobody serves, published after the strict one: once the
		// baseline has handled it, discovery has seen both lanes.
		e.publish("ghost", "x", 1)
		r.wait(t, 2, 10*time.Second)
		waitOwned(t, base, "_", "ghost")
		if gs := r.all(); len(gs) != 2 || gs[0].lane == "secret" || gs[1].lane == "secret" {
			t.Fatalf("the baseline handled a strict lane's messages:\n%s", summary(gs))
		}
		e.consumer("secret-1", "secret", r.handler("secret-1"))
		gs := r.wait(t, 7, 10*time.Second)
		if got := byWho(gs); got["secret-1 secret"] != 5 {
			t.Errorf("handled %v", got)
		}
	})
}

// TestOrderWithinLane: one consumer of a lane handles each subject's
// messages in the order published, across batches.
func TestOrderWithinLane(t *testing.T) {
	natstest.Each(t, func(t *testing.T, srv natstest.Server) {
		e := newEnv(t, srv, "")
		r := newRecorder()
		e.consumer("alice-1", "alice", r.handler("alice-1"), lanesnats.WithBatch(7))
		const n = 300
		ctx := lane.WithLane(context.Background(), "alice")
		for i := range n {
			subj := []string{"a", "b", "c"}[i%3]
			if _, err := e.pub.PublishMsgAsync(ctx, &nats.Msg{Subject: subj, Data: fmt.Appendf(nil, "%d", i)}); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-e.js.PublishAsyncComplete():
		case <-time.After(10 * time.Second):
			t.Fatal("publishing did not complete")
		}
		gs := r.wait(t, n, 20*time.Second)
		last := map[string]int{}
		for _, g := range gs {
			var i int
			fmt.Sscan(g.data, &i)
			if prev, ok := last[g.subject]; ok && i <= prev {
				t.Fatalf("subject %s: %d after %d", g.subject, i, prev)
			}
			last[g.subject] = i
		}
	})
}

// TestDeadLetter: a message that fails on its last allowed delivery goes to
// the dead-letter topic in its lane, with its headers and the reason; a
// Permanent error sends it there at once. Nothing is delivered again after.
func TestDeadLetter(t *testing.T) {
	natstest.Each(t, func(t *testing.T, srv natstest.Server) {
		e := newEnv(t, srv, "")
		var calls atomic.Int32
		h := lanesnats.HandlerFunc(func(ctx context.Context, d *lanesnats.Delivery) error {
			calls.Add(1)
			if d.Subject == "poison" {
				return lanesnats.Permanent(errors.New("cannot parse"))
			}
			return fmt.Errorf("failure %d", d.NumDelivered)
		})
		c := e.consumer("alice-1", "alice", h, lanesnats.WithMaxDeliver(3))
		ctx := lane.WithLane(context.Background(), "alice")
		if _, err := e.pub.PublishMsg(ctx, &nats.Msg{Subject: "bad", Data: []byte("payload"), Header: nats.Header{"X-Trace": {"t1"}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.pub.Publish(ctx, "poison", nil); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "two dead letters", func() bool { return c.Stats().DeadLettered == 2 })
		dlq, err := e.js.Stream(context.Background(), lanesnats.DeadLetterTopic(e.topic))
		if err != nil {
			t.Fatal(err)
		}
		m, err := dlq.GetLastMsgForSubject(context.Background(), "orders-dlq.alice.bad")
		if err != nil {
			t.Fatal(err)
		}
		hd := m.Header
		if string(m.Data) != "payload" || hd.Get("X-Trace") != "t1" || lane.MessageHeader(hd).Get("x-lane") != "alice" ||
			hd.Get(lanesnats.HeaderDLQGroup) != "invoices" || hd.Get(lanesnats.HeaderDLQDeliveries) != "3" ||
			hd.Get(lanesnats.HeaderDLQError) != "failure 3" || hd.Get(lanesnats.HeaderDLQSubject) != "orders.alice.bad" {
			t.Errorf("dead letter %q %v", m.Data, hd)
		}
		p, err := dlq.GetLastMsgForSubject(context.Background(), "orders-dlq.alice.poison")
		if err != nil {
			t.Fatal(err)
		}
		if p.Header.Get(lanesnats.HeaderDLQDeliveries) != "1" {
			t.Errorf("permanent failure after %s deliveries", p.Header.Get(lanesnats.HeaderDLQDeliveries))
		}
		time.Sleep(300 * time.Millisecond)
		if n := calls.Load(); n != 4 {
			t.Errorf("handler called %d times, want 3 + 1", n)
		}
		// The dead letters are a topic of their own, consumed lane by lane.
		r := newRecorder()
		dc, err := lanesnats.NewConsumer(context.Background(), e.js, lanesnats.ConsumerConfig{
			Service: "ops", Group: "dlq", Topic: lanesnats.DeadLetterTopic(e.topic), Registry: e.reg, Engine: e.eng,
			Instance: registry.Instance{ID: "ops-1", Lane: "alice"},
		}, r.handler("ops-1"), testOpts(lanesnats.WithDeadLetterTopic("orders-dlq2"))...)
		if err != nil {
			t.Fatal(err)
		}
		defer dc.Close()
		gs := r.wait(t, 2, 10*time.Second)
		for _, g := range gs {
			if g.ctxLane != "alice" {
				t.Errorf("dead letter handled in lane %q", g.ctxLane)
			}
		}
	})
}

// TestInvalidLaneIsBaseline: messages whose subject carries a token that is
// not a lane name (from a foreign producer) are handled by the baseline, in
// the baseline; the subject decides, not a header.
func TestInvalidLaneIsBaseline(t *testing.T) {
	e := newEnv(t, natstest.Embedded(t), "")
	r := newRecorder()
	e.consumer("alice-1", "alice", r.handler("alice-1"))
	base := e.consumer("base-1", "", r.handler("base-1"))
	ctx := context.Background()
	for _, m := range []*nats.Msg{
		{Subject: "orders.Bad_Lane.x", Header: nats.Header{"x-lane": {"Bad_Lane"}}},
		{Subject: "orders._.x", Header: nats.Header{"x-lane": {"alice"}}},
		{Subject: "orders.ALICE.x"},
	} {
		if _, err := e.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	gs := r.wait(t, 3, 10*time.Second)
	for _, g := range gs {
		if g.who != "base-1" || g.lane != "" || g.ctxLane != "" {
			t.Errorf("delivery %+v", g)
		}
	}
	if owned := base.Owned(); len(owned) != 3 {
		t.Errorf("baseline owns %q", owned)
	}
}

// TestOrphanLaneReachesBaseline: a message in a lane the group has never
// seen and no consumer serves reaches the baseline within the discovery
// interval plus one fetch (docs/mq.md).
func TestOrphanLaneReachesBaseline(t *testing.T) {
	natstest.Each(t, func(t *testing.T, srv natstest.Server) {
		e := newEnv(t, srv, "")
		r := newRecorder()
		const interval = 500 * time.Millisecond
		base := e.consumer("base-1", "", r.handler("base-1"), lanesnats.WithDiscoveryInterval(interval))
		waitOwned(t, base, "_")
		start := time.Now()
		e.publish("ghost", "x", 1)
		r.wait(t, 1, 10*time.Second)
		took := time.Since(start)
		bound := interval + 3*time.Second // + slack for a loaded machine (-race, other builds)
		t.Logf("a message for lane ghost reached the baseline in %v (bound %v)", took.Round(time.Millisecond), bound)
		if took > bound {
			t.Errorf("took %v, more than %v", took, bound)
		}
	})
}

// TestHandOff: a lane's messages go to the baseline while the lane has no
// consumer, to the lane's consumer while it runs, and back to the baseline
// when it closes; nothing is lost or handled twice.
func TestHandOff(t *testing.T) {
	e := newEnv(t, natstest.Embedded(t), "")
	r := newRecorder()
	base := e.consumer("base-1", "", r.handler("base-1"))
	waitOwned(t, base, "_")
	e.publish("alice", "x", 20)
	r.wait(t, 20, 10*time.Second)
	waitOwned(t, base, "_", "alice")

	alice := e.consumer("alice-1", "alice", r.handler("alice-1"))
	waitOwned(t, base, "_")
	waitOwned(t, alice, "alice")
	e.publish("alice", "y", 20)
	r.wait(t, 40, 10*time.Second)
	if err := alice.Close(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(alice.Err(), lanesnats.ErrClosed) {
		t.Errorf("Err after Close: %v", alice.Err())
	}
	if len(alice.Owned()) != 0 {
		t.Errorf("a closed consumer owns %q", alice.Owned())
	}
	waitOwned(t, base, "_", "alice")
	e.publish("alice", "z", 20)
	r.wait(t, 60, 10*time.Second)
	time.Sleep(200 * time.Millisecond)
	gs := r.all()
	seen := map[uint64]bool{}
	for i, g := range gs {
		if seen[g.seq] {
			t.Errorf("seq %d handled twice", g.seq)
		}
		seen[g.seq] = true
		want := "base-1"
		if g.subject == "y" {
			want = "alice-1"
		}
		if g.who != want {
			t.Errorf("delivery %d: %+v, want %s", i, g, want)
		}
	}
	if len(gs) != 60 {
		t.Errorf("%d deliveries, want 60", len(gs))
	}
}

// TestExpiredLane: the consumer of an expired lane gives its lane to the
// baseline, and takes it back when the policy changes again.
func TestExpiredLane(t *testing.T) {
	e := newEnv(t, natstest.Embedded(t), "")
	r := newRecorder()
	base := e.consumer("base-1", "", r.handler("base-1"))
	alice := e.consumer("alice-1", "alice", r.handler("alice-1"))
	waitOwned(t, alice, "alice")
	e.setPolicy("lanes:\n  alice:\n    expires: 2000-01-01T00:00:00Z\n")
	waitOwned(t, alice)
	waitOwned(t, base, "_", "alice")
	e.setPolicy("")
	waitOwned(t, alice, "alice")
	waitOwned(t, base, "_")
}

// TestSlowHandlerNotRedelivered: handlers slower than AckWait, and the
// messages waiting behind them, are kept alive: no message is delivered
// twice, neither to this consumer nor to the other one of the lane.
func TestSlowHandlerNotRedelivered(t *testing.T) {
	e := newEnv(t, natstest.Embedded(t), "")
	r := newRecorder()
	rec := r.handler("alice-1")
	var slow atomic.Int32
	h := lanesnats.HandlerFunc(func(ctx context.Context, d *lanesnats.Delivery) error {
		if slow.Add(1) <= 5 {
			time.Sleep(300 * time.Millisecond) // 1.5s in all, three AckWaits
		}
		return rec.HandleMessage(ctx, d)
	})
	e.publish("alice", "x", 50)
	e.consumer("alice-1", "alice", h, lanesnats.WithAckWait(500*time.Millisecond))
	waitFor(t, 5*time.Second, "the slow handler", func() bool { return slow.Load() > 0 })
	e.consumer("alice-2", "alice", r.handler("alice-2"), lanesnats.WithAckWait(500*time.Millisecond))
	r.wait(t, 50, 10*time.Second)
	time.Sleep(time.Second)
	for _, g := range r.all() {
		if g.n != 1 {
			t.Errorf("delivered again: %+v", g)
		}
	}
	if n := len(r.all()); n != 50 {
		t.Errorf("%d deliveries, want 50", n)
	}
}

// TestConsumerConfigErrors: bad settings fail NewConsumer with typed
// errors, before anything registers.
func TestConsumerConfigErrors(t *testing.T) {
	e := newEnv(t, natstest.Embedded(t), "")
	ctx := context.Background()
	h := lanesnats.HandlerFunc(func(context.Context, *lanesnats.Delivery) error { return nil })
	good := lanesnats.ConsumerConfig{Service: "billing", Group: "invoices", Topic: e.topic, Registry: e.reg, Engine: e.eng}
	for _, c := range []struct {
		name string
		cfg  func(lanesnats.ConsumerConfig) lanesnats.ConsumerConfig
		opt  lanesnats.ConsumerOpt
		want error
	}{
		{"no registry", func(c lanesnats.ConsumerConfig) lanesnats.ConsumerConfig { c.Registry = nil; return c }, nil, lanesnats.ErrInvalidOption},
		{"bad group", func(c lanesnats.ConsumerConfig) lanesnats.ConsumerConfig { c.Group = "a.b"; return c }, nil, lanesnats.ErrInvalidGroup},
		{"bad topic", func(c lanesnats.ConsumerConfig) lanesnats.ConsumerConfig { c.Topic = ""; return c }, nil, lanesnats.ErrInvalidTopic},
		{"no stream", func(c lanesnats.ConsumerConfig) lanesnats.ConsumerConfig { c.Topic = "nothing"; return c }, nil, lanesnats.ErrStreamNotFound},
		{"service set", func(c lanesnats.ConsumerConfig) lanesnats.ConsumerConfig { c.Instance.Service = "x"; return c }, nil, lanesnats.ErrInvalidOption},
		{"ack wait", nil, lanesnats.WithAckWait(time.Millisecond), lanesnats.ErrInvalidOption},
		{"max deliver", nil, lanesnats.WithMaxDeliver(0), lanesnats.ErrInvalidOption},
		{"batch", nil, lanesnats.WithBatch(0), lanesnats.ErrInvalidOption},
		{"retry delays", nil, lanesnats.WithRetryDelays(), lanesnats.ErrInvalidOption},
		{"dead letter", nil, lanesnats.WithDeadLetterTopic("a.b"), lanesnats.ErrInvalidOption},
		{"bad lane", nil, lanesnats.WithLane("-x-"), nil},
	} {
		cfg := good
		if c.cfg != nil {
			cfg = c.cfg(cfg)
		}
		cons, err := lanesnats.NewConsumer(ctx, e.js, cfg, h, c.opt, lanesnats.WithLogger(quiet()))
		if err == nil {
			cons.Close()
			t.Errorf("%s: no error", c.name)
			continue
		}
		if c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// An engine that does not follow the registry would never give the
	// consumer a lane: NewConsumer says so, and deregisters.
	blind := routing.New()
	defer blind.Close()
	cfg := good
	cfg.Engine = blind
	tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if cons, err := lanesnats.NewConsumer(tctx, e.js, cfg, h, lanesnats.WithLogger(quiet())); err == nil {
		cons.Close()
		t.Error("an engine without the registry accepted")
	}
	if n := len(e.eng.Service(lanesnats.RegistryService("billing", "invoices")).Instances()); n != 0 {
		t.Errorf("%d instances left registered", n)
	}
}

// TestDurableDeleted: when someone deletes a lane's durable consumer, the
// consumer that owns the lane creates it again and goes on (what the stream
// still holds of the lane is delivered again: its cursor is gone).
func TestDurableDeleted(t *testing.T) {
	e := newEnv(t, natstest.Embedded(t), "")
	r := newRecorder()
	alice := e.consumer("alice-1", "alice", r.handler("alice-1"))
	waitOwned(t, alice, "alice")
	e.publish("alice", "before", 3)
	r.wait(t, 3, 10*time.Second)
	if err := e.js.DeleteConsumer(context.Background(), e.topic, lanesnats.ConsumerName("invoices", "alice")); err != nil {
		t.Fatal(err)
	}
	e.publish("alice", "after", 3)
	gs := r.wait(t, 9, 20*time.Second) // 3 before, again, and 3 after
	after := 0
	for _, g := range gs {
		if g.subject == "after" {
			after++
		}
	}
	if after != 3 {
		t.Errorf("handled after the deletion:\n%s", summary(gs))
	}
}

// TestServerRestart: the NATS server goes down while messages are
// published and handled, and comes back on its store: a clean stop of the
// embedded server, and a SIGKILL of the embedded server in a process of its
// own and of a nats-server process. No acknowledged publish is lost: every
// message whose publish was acknowledged before the crash is in the stream
// after it and is handled; a publish that failed is retried with its id and
// stored once. The consumer resumes by itself.
func TestServerRestart(t *testing.T) {
	for _, k := range []struct {
		name  string
		start func(testing.TB) natstest.Server
	}{
		{"embedded", func(t testing.TB) natstest.Server { return natstest.Embedded(t) }},
		{"embedded-process", func(t testing.TB) natstest.Server { return natstest.EmbeddedProcess(t) }},
		{"process", func(t testing.TB) natstest.Server { return natstest.Process(t) }},
	} {
		t.Run(k.name, func(t *testing.T) { testServerRestart(t, k.start(t)) })
	}
}

func testServerRestart(t *testing.T, srv natstest.Server) {
	const n = 400
	e := newEnv(t, srv, "")
	r := newRecorder()
	rec := r.handler("alice-1")
	slow := lanesnats.HandlerFunc(func(ctx context.Context, d *lanesnats.Delivery) error {
		time.Sleep(time.Millisecond) // so that the crash finds messages in flight
		return rec.HandleMessage(ctx, d)
	})
	alice := e.consumer("alice-1", "alice", slow)
	waitOwned(t, alice, "alice")

	// The producer publishes n messages with ids, one at a time, retrying
	// each until it is acknowledged; the server goes down half-way.
	type ackAt struct {
		seq uint64
		at  time.Time
	}
	var mu sync.Mutex
	acked := map[string]ackAt{}
	half := make(chan struct{})
	pubDone := make(chan error, 1)
	go func() {
		ctx := lane.WithLane(context.Background(), "alice")
		for i := range n {
			if i == n/2 {
				close(half)
			}
			data := fmt.Sprintf("alice/x/%d", i)
			deadline := time.Now().Add(60 * time.Second)
			for {
				actx, cancel := context.WithTimeout(ctx, 2*time.Second)
				ack, err := e.pub.Publish(actx, "x", []byte(data), jetstream.WithMsgID(data))
				cancel()
				if err == nil {
					mu.Lock()
					acked[data] = ackAt{ack.Sequence, time.Now()}
					mu.Unlock()
					break
				}
				if time.Now().After(deadline) {
					pubDone <- fmt.Errorf("publish %s: %w", data, err)
					return
				}
				time.Sleep(20 * time.Millisecond) // the server is down: try again
			}
		}
		pubDone <- nil
	}()
	<-half
	crash := time.Now()
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if err := <-pubDone; err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, fmt.Sprintf("%d distinct messages handled", n), func() bool { return len(distinct(r.all())) == n })

	st, err := e.js.Stream(context.Background(), e.topic)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().State.Msgs; got != n {
		t.Errorf("the stream holds %d messages, want %d (one per id)", got, n)
	}
	before := 0
	for data, a := range acked {
		if !a.at.Before(crash) {
			continue
		}
		before++
		m, err := st.GetMsg(context.Background(), a.seq)
		if err != nil || string(m.Data) != data {
			t.Errorf("%s, acknowledged before the crash as seq %d, is not in the stream after it: %v", data, a.seq, err)
		}
	}
	gs := r.all()
	t.Logf("%s: %d publishes acknowledged before the crash, all in the stream after it; %d handlings of %d messages", srv.Kind(), before, len(gs), n)
}

// distinct returns the distinct payloads of gs.
func distinct(gs []got) map[string]bool {
	seen := map[string]bool{}
	for _, g := range gs {
		seen[g.data] = true
	}
	return seen
}

// TestCloseDrainTimeout: Close waits for the handler in progress only up to
// the drain timeout, then cancels its context; what the consumer held is
// given back, and the lane's next consumer handles everything.
func TestCloseDrainTimeout(t *testing.T) {
	e := newEnv(t, natstest.Embedded(t), "")
	blocked := make(chan struct{})
	var once atomic.Bool
	stuck := lanesnats.HandlerFunc(func(ctx context.Context, d *lanesnats.Delivery) error {
		if once.CompareAndSwap(false, true) {
			close(blocked)
		}
		<-ctx.Done() // never finishes by itself
		return ctx.Err()
	})
	c := e.consumer("alice-1", "alice", stuck, lanesnats.WithDrainTimeout(300*time.Millisecond))
	e.publish("alice", "x", 5)
	select {
	case <-blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler was never called")
	}
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Close took %v with a drain timeout of 300ms", took)
	}
	select {
	case <-c.Done():
	default:
		t.Error("Done not closed after Close")
	}
	r := newRecorder()
	e.consumer("alice-2", "alice", r.handler("alice-2"))
	gs := r.wait(t, 5, 10*time.Second)
	time.Sleep(200 * time.Millisecond)
	if n := len(r.all()); n != 5 {
		t.Errorf("%d deliveries, want 5:\n%s", n, summary(gs))
	}
}
