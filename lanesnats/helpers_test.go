package lanesnats_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/testkit/leaktest"
	"github.com/lanesdev/lanes/internal/testkit/natstest"
	"github.com/lanesdev/lanes/internal/testkit/timing"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesnats"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

func TestMain(m *testing.M) {
	natstest.RunChild()
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	goleak.VerifyTestMain(m, leaktest.Options()...)
}

// quiet is the logger of the tests; LANESNATS_DEBUG=1 shows the consumers'
// logs.
func quiet() *slog.Logger {
	if os.Getenv("LANESNATS_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// env is one topic on one NATS server, with an in-memory registry and
// policy store and an engine that follows them.
type env struct {
	t     testing.TB
	url   string
	nc    *nats.Conn
	js    jetstream.JetStream
	reg   *registry.Memory
	pol   *policy.Memory
	eng   *routing.Engine
	topic string
	pub   *lanesnats.Publisher
}

func newEnv(t testing.TB, srv natstest.Server, pol string) *env {
	t.Helper()
	ctx := context.Background()
	nc, js := natstest.Connect(t, srv.URL())
	e := &env{t: t, url: srv.URL(), nc: nc, js: js, reg: registry.NewMemory(), pol: policy.NewMemory(), topic: "orders"}
	t.Cleanup(func() { e.reg.Close() })
	if pol != "" {
		if _, err := e.pol.Put(ctx, []byte(pol)); err != nil {
			t.Fatal(err)
		}
	}
	e.eng = routing.New(routing.WithRegistry(e.reg), routing.WithPolicyStore(e.pol), routing.WithLogger(quiet()))
	t.Cleanup(func() { e.eng.Close() })
	<-e.eng.PolicyReady()
	for _, topic := range []string{e.topic, lanesnats.DeadLetterTopic(e.topic)} {
		if _, err := js.CreateOrUpdateStream(ctx, lanesnats.StreamConfig(topic)); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	if e.pub, err = lanesnats.NewPublisher(js, e.topic); err != nil {
		t.Fatal(err)
	}
	return e
}

// setPolicy puts a policy in force and waits until the engine has it.
func (e *env) setPolicy(doc string) {
	e.t.Helper()
	old := e.eng.Policy()
	if _, err := e.pol.Put(context.Background(), []byte(doc)); err != nil {
		e.t.Fatal(err)
	}
	waitFor(e.t, 5*time.Second, "the new policy", func() bool { return e.eng.Policy() != old })
}

// testOpts are fast settings for tests.
func testOpts(extra ...lanesnats.ConsumerOpt) []lanesnats.ConsumerOpt {
	return append([]lanesnats.ConsumerOpt{
		lanesnats.WithLogger(quiet()),
		lanesnats.WithEnv(func(string) string { return "" }),
		lanesnats.WithDiscoveryInterval(100 * time.Millisecond),
		lanesnats.WithAckWait(2 * time.Second),
		lanesnats.WithRetryDelays(10 * time.Millisecond),
		lanesnats.WithDrainTimeout(5 * time.Second),
	}, extra...)
}

// consumer starts a consumer of the env's topic, service "billing", group
// "invoices", in lane l, with id; it is closed at cleanup.
func (e *env) consumer(id, l string, h lanesnats.Handler, opts ...lanesnats.ConsumerOpt) *lanesnats.Consumer {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := lanesnats.NewConsumer(ctx, e.js, lanesnats.ConsumerConfig{
		Service: "billing", Group: "invoices", Topic: e.topic, Registry: e.reg, Engine: e.eng,
		Instance: registry.Instance{ID: id, Lane: l},
	}, h, testOpts(opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// publish publishes n messages in lane l with the subject subj; their data
// is "<l>/<subj>/<i>".
func (e *env) publish(l, subj string, n int) {
	e.t.Helper()
	ctx := lane.WithLane(context.Background(), l)
	for i := range n {
		if _, err := e.pub.Publish(ctx, subj, fmt.Appendf(nil, "%s/%s/%d", l, subj, i)); err != nil {
			e.t.Fatal(err)
		}
	}
}

// got is one handled delivery.
type got struct {
	who     string // the consumer's id
	lane    string // Delivery.Lane
	ctxLane string // lane.FromContext of the handler's context
	subject string
	data    string
	seq     uint64
	n       uint64 // NumDelivered
	header  nats.Header
}

// recorder records the deliveries its handlers see.
type recorder struct {
	mu   sync.Mutex
	got  []got
	wake chan struct{}
}

func newRecorder() *recorder { return &recorder{wake: make(chan struct{}, 1)} }

func (r *recorder) handler(who string) lanesnats.Handler {
	return lanesnats.HandlerFunc(func(ctx context.Context, d *lanesnats.Delivery) error {
		r.add(got{who: who, lane: d.Lane, ctxLane: lane.FromContext(ctx), subject: d.Subject, data: string(d.Data), seq: d.Seq, n: d.NumDelivered, header: d.Header})
		return nil
	})
}

func (r *recorder) add(g got) {
	r.mu.Lock()
	r.got = append(r.got, g)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *recorder) all() []got {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]got(nil), r.got...)
}

// wait waits until n deliveries are recorded and returns them.
func (r *recorder) wait(t testing.TB, n int, within time.Duration) []got {
	t.Helper()
	deadline := time.After(within)
	for {
		if g := r.all(); len(g) >= n {
			return g
		}
		select {
		case <-r.wake:
		case <-deadline:
			g := r.all()
			t.Fatalf("%d deliveries after %v, want %d:\n%s", len(g), within, n, summary(g))
			return nil
		}
	}
}

// summary counts deliveries by consumer and lane.
func summary(gs []got) string {
	m := map[string]int{}
	for _, g := range gs {
		m[fmt.Sprintf("%s handled lane %q", g.who, g.lane)]++
	}
	var lines []string
	for k, v := range m {
		lines = append(lines, fmt.Sprintf("  %s: %d", k, v))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// byWho counts deliveries by "<who> <lane>".
func byWho(gs []got) map[string]int {
	m := map[string]int{}
	for _, g := range gs {
		m[g.who+" "+g.lane]++
	}
	return m
}

func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	timing.Until(t, what, within, cond)
}

// owns waits until c fetches exactly the given lane tokens.
func waitOwned(t testing.TB, c *lanesnats.Consumer, want ...string) {
	t.Helper()
	sort.Strings(want)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := c.Owned()
		if strings.Join(got, ",") == strings.Join(want, ",") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s owns %q, want %q", c.Instance().ID, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
