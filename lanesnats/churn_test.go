//go:build unix

package lanesnats_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/internal/testkit/natstest"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesnats"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// childEnv, when set, makes the test binary run as a consumer process of
// TestChurn (see childMain) instead of running tests.
const childEnv = "LANESNATS_CHURN_CHILD"

// The settings of TestChurn, tuned down from the defaults so that hand-offs
// take seconds.
const (
	churnTopic     = "churn"
	churnTTL       = 2 * time.Second
	churnAckWait   = 2 * time.Second
	churnDiscovery = 500 * time.Millisecond
	churnPerLane   = 5000
	churnPublish   = 15 * time.Second // how long the producers take
	// churnSettle is how long the producers go on after the faults of a
	// run with faults are over (the last server back, the stream taking
	// publishes again): the rest of the workload proves nothing more, and
	// on a three-server cluster it took minutes on a loaded machine.
	churnSettle = 3 * time.Second
	// churnPatience is how long a producer publishes one message again
	// while the stream has no leader, and how long a server kill may take
	// to recover from.
	churnPatience = 2 * time.Minute
)

// churnLanes are the lanes of TestChurn besides the baseline.
var churnLanes = []string{"l1", "l2", "l3"}

// childMain runs one consumer of TestChurn, configured by CHURN_*
// variables: it registers in etcd, prints READY, then prints one line per
// handled message ("H <seq> <lane token> <id> <unix nanos> <deliveries> <message id>"),
// written before the handler returns (so before the ack; then it works for
// CHURN_WORK more), until SIGTERM, when it closes gracefully and prints
// CLOSED.
func childMain() int {
	get := os.Getenv
	id, l := get("CHURN_ID"), get("CHURN_LANE")
	workAfter, _ := time.ParseDuration(get("CHURN_WORK"))
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("child", id)
	fail := func(what string, err error) int {
		log.Error(what, "err", err)
		return 3
	}
	sig, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := nats.Connect(get("CHURN_NATS"), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.PingInterval(time.Second), nats.MaxPingsOutstanding(2))
	if err != nil {
		return fail("nats", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fail("jetstream", err)
	}
	store, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: []string{get("CHURN_ETCD")}, Options: etcdstore.Options{Logger: log}})
	if err != nil {
		return fail("etcd", err)
	}
	defer store.Close()
	eng := routing.New(routing.WithRegistry(store), routing.WithPolicyStore(store.Policy()), routing.WithLogger(log))
	defer eng.Close()
	out := os.Stdout
	h := lanesnats.HandlerFunc(func(ctx context.Context, d *lanesnats.Delivery) error {
		if lane.FromContext(ctx) != d.Lane {
			return lanesnats.Permanent(fmt.Errorf("context lane %q, message lane %q", lane.FromContext(ctx), d.Lane))
		}
		_, err := out.WriteString(fmt.Sprintf("H %d %s %s %d %d %s\n", d.Seq, lanesnats.Token(d.Lane), id, time.Now().UnixNano(), d.NumDelivered, d.Data))
		// Work after the side effect: a kill here leaves a message handled
		// but not acknowledged, which comes back as a duplicate.
		time.Sleep(workAfter)
		return err
	})
	c, err := lanesnats.NewConsumer(ctx, js, lanesnats.ConsumerConfig{
		Service: "churn", Group: "g", Topic: churnTopic, Registry: store, Engine: eng,
		Instance: registry.Instance{ID: id, Lane: l},
	}, h,
		lanesnats.WithLogger(log), lanesnats.WithEnv(func(string) string { return "" }),
		lanesnats.WithTTL(churnTTL), lanesnats.WithAckWait(churnAckWait),
		lanesnats.WithDiscoveryInterval(churnDiscovery), lanesnats.WithBatch(32), lanesnats.WithMaxDeliver(100),
		lanesnats.WithRetryDelays(50*time.Millisecond))
	if err != nil {
		return fail("consumer", err)
	}
	fmt.Fprintf(out, "READY %d\n", time.Now().UnixNano())
	select {
	case <-sig.Done():
	case <-c.Done():
		return fail("consumer stopped", c.Err())
	}
	if err := c.Close(); err != nil {
		return fail("close", err)
	}
	fmt.Fprintf(out, "CLOSED %d\n", time.Now().UnixNano())
	return 0
}

// handling is one line of a child: a message handled.
type handling struct {
	msg string // the message: its publisher's id, which is its data
	seq uint64
	tok string // the message's lane token, as the child saw it
	id  string // the child
	at  time.Time
	n   uint64 // NumDelivered
}

// child is one consumer process of TestChurn.
type child struct {
	id, lane string
	cmd      *exec.Cmd
	ready    chan struct{}
	exited   chan struct{}
	stderr   bytes.Buffer // guarded by churn.mu

	// guarded by churn.mu
	readyAt, stopAt time.Time
	exitedAt        time.Time // when the test saw it exit: a killed child handles nothing after
	killed          bool
}

// churn runs TestChurn: the children, and what they report.
type churn struct {
	t             *testing.T
	natsURL, etcd string
	mu            sync.Mutex
	handled       []handling
	children      []*child
	readers       sync.WaitGroup
	starts, kills int
	terms         int
	serverKills   []serverKill // guarded by mu
}

// serverKill is a NATS server's SIGKILL and the stream's recovery from it.
type serverKill struct {
	at time.Time
	// recovered is when the first publish sent after at was acknowledged
	// (zero until then): the stream had a leader again. With nats-server
	// 2.9.10 on a loaded machine that once took 30s.
	recovered time.Time
}

// end is when the outage of the kill ended: its recovery, or, before it,
// never.
func (k serverKill) end() time.Time {
	if k.recovered.IsZero() {
		return time.Unix(1<<40, 0)
	}
	return k.recovered
}

// acked notes a publish sent at sent and acknowledged at t: the stream
// has recovered from every server kill before sent.
func (ch *churn) acked(sent, t time.Time) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	for i := range ch.serverKills {
		if k := &ch.serverKills[i]; k.recovered.IsZero() && sent.After(k.at) {
			k.recovered = t
		}
	}
}

// waitRecovered waits until the stream has recovered from the i-th server
// kill, or stop is closed (no more publishes), or ctx is done.
func (ch *churn) waitRecovered(ctx context.Context, i int, stop <-chan struct{}) error {
	for {
		ch.mu.Lock()
		done := !ch.serverKills[i].recovered.IsZero()
		ch.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("no publish acknowledged since the kill: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (ch *churn) start(id, l string) *child {
	ch.t.Helper()
	c := &child{id: id, lane: l, ready: make(chan struct{}), exited: make(chan struct{})}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "CHURN_NATS="+ch.natsURL, "CHURN_ETCD="+ch.etcd, "CHURN_ID="+id, "CHURN_LANE="+l, "CHURN_WORK=2ms")
	cmd.Stderr = &lockedWriter{mu: &ch.mu, w: &c.stderr}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		ch.t.Fatal(err)
	}
	setPdeathsig(cmd)
	if err := cmd.Start(); err != nil {
		ch.t.Fatal(err)
	}
	c.cmd = cmd
	ch.mu.Lock()
	ch.children = append(ch.children, c)
	ch.starts++
	ch.mu.Unlock()
	ch.readers.Add(1)
	go func() { // owned by ch: the test waits for readers
		defer ch.readers.Done()
		defer close(c.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 2 && f[0] == "READY":
				ch.mu.Lock()
				c.readyAt = time.Unix(0, atoi(f[1]))
				ch.mu.Unlock()
				close(c.ready)
			case len(f) == 7 && f[0] == "H":
				hd := handling{seq: uint64(atoi(f[1])), tok: f[2], id: f[3], at: time.Unix(0, atoi(f[4])), n: uint64(atoi(f[5])), msg: f[6]}
				ch.mu.Lock()
				ch.handled = append(ch.handled, hd)
				ch.mu.Unlock()
			}
		}
		cmd.Wait()
		ch.mu.Lock()
		c.exitedAt = time.Now()
		ch.mu.Unlock()
	}()
	select {
	case <-c.ready:
	case <-c.exited:
		ch.t.Errorf("child %s exited before it was ready: %s", id, ch.stderrOf(c))
	case <-time.After(60 * time.Second):
		ch.t.Errorf("child %s not ready after 60s", id)
	}
	return c
}

// stop stops a child with SIGTERM (graceful) or SIGKILL, and waits for it.
func (ch *churn) stop(c *child, kill bool) {
	ch.mu.Lock()
	c.stopAt, c.killed = time.Now(), kill
	if kill {
		ch.kills++
	} else {
		ch.terms++
	}
	ch.mu.Unlock()
	if kill {
		c.cmd.Process.Kill()
	} else {
		c.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-c.exited:
	case <-time.After(30 * time.Second):
		ch.t.Errorf("child %s still running 30s after SIGTERM; killing it", c.id)
		c.cmd.Process.Kill()
		<-c.exited
	}
	if !kill && c.cmd.ProcessState != nil && c.cmd.ProcessState.ExitCode() != 0 {
		ch.t.Errorf("child %s exited with %d after SIGTERM: %s", c.id, c.cmd.ProcessState.ExitCode(), ch.stderrOf(c))
	}
}

func (ch *churn) stderrOf(c *child) string {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return c.stderr.String()
}

// TestChurn: three lanes and the baseline, 20,000 messages published in
// all four while lane consumers (child processes) start, stop gracefully
// and are killed with SIGKILL at random (seeded) times. Every message is
// handled, by the consumers of its lane or, when it has none, by the
// baseline; baseline messages only by the baseline; a message is handled
// twice only when its first holder was killed, within the hand-off window
// (AckWait + lease TTL after the kill, plus slack for a loaded machine).
//
// The registry is an embedded etcd (leases across processes), NATS an
// embedded JetStream server in the test process. LANESNATS_CHURN_SEED
// replays a run.
func TestChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("churn takes about 30s")
	}
	ns := natstest.Embedded(t)
	runChurn(t, ns.URL(), 1, nil)
}

// TestChurnClusterKill: the workload of TestChurn on a cluster of three
// NATS servers with R3 streams, while the servers are killed with SIGKILL
// one at a time: the stream's leader about 4s in, restarted 3s later, then
// again whichever member leads it then; the producers stop churnSettle
// after the stream takes publishes again. No message is lost; besides the
// duplicates of killed consumers, a message may be handled again when a
// server died with its ack, within the hand-off window of the server kill.
func TestChurnClusterKill(t *testing.T) {
	if testing.Short() {
		t.Skip("churn takes about 30s")
	}
	c := natstest.NewCluster(t, natstest.ClusterConfig{})
	t.Logf("a cluster of %d %s NATS servers", len(c.Members), c.Kind())
	runChurn(t, c.URL(), 3, func(ch *churn, js jetstream.JetStream, stop <-chan struct{}) {
		for i, after := range []time.Duration{4 * time.Second, 2 * time.Second} {
			if sleepOr(stop, after) {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), churnPatience)
			m, err := c.StreamLeader(ctx, js, churnTopic)
			if err != nil {
				cancel()
				ch.t.Errorf("kill %d: %v", i+1, err)
				return
			}
			ch.mu.Lock()
			ch.serverKills = append(ch.serverKills, serverKill{at: time.Now()})
			ch.mu.Unlock()
			m.Kill()
			ch.t.Logf("killed NATS server %s (the stream's leader) with SIGKILL at %v", m.Name(), time.Now().Format("15:04:05.000"))
			sleepOr(stop, 3*time.Second)
			if err := m.Start(); err != nil {
				ch.t.Errorf("restart %s: %v", m.Name(), err)
			}
			if err := c.WaitJetStream(ctx); err != nil {
				ch.t.Errorf("after restarting %s: %v", m.Name(), err)
			}
			// The next kill only once the stream takes publishes again.
			if err := ch.waitRecovered(ctx, i, stop); err != nil {
				ch.t.Errorf("after killing %s: %v", m.Name(), err)
			}
			cancel()
		}
	})
}

// runChurn runs the churn workload against the NATS servers at natsURL
// (comma-separated), with streams of the given replicas; faults, when not
// nil, runs beside the producers until stop is closed.
func runChurn(t *testing.T, natsURL string, replicas int, faults func(ch *churn, js jetstream.JetStream, stop <-chan struct{})) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("LANESNATS_CHURN_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (LANESNATS_CHURN_SEED=%d replays the schedule)", seed, seed)
	etcd := etcdtest.Embedded(t)
	_, js := natstest.Connect(t, natsURL)
	ctx := context.Background()
	cfg := lanesnats.StreamConfig(churnTopic)
	cfg.Replicas = replicas
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	ch := &churn{t: t, natsURL: natsURL, etcd: etcd.Endpoints()[0]}
	defer func() {
		if t.Failed() {
			ch.mu.Lock()
			for _, c := range ch.children {
				if c.stderr.Len() > 0 {
					t.Logf("stderr of %s:\n%s", c.id, c.stderr.String())
				}
			}
			ch.mu.Unlock()
		}
	}()
	bases := []*child{ch.start("base-1", ""), ch.start("base-2", "")}

	// Producers: one per lane and one for the baseline, at an even pace.
	var pmu sync.Mutex
	var published []pub
	var longestPublish time.Duration // guarded by pmu
	var wg sync.WaitGroup
	begin := time.Now()
	enough := make(chan struct{}) // closed churnSettle after the faults end
	for i, l := range append([]string{""}, churnLanes...) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := lanesnats.NewPublisher(js, churnTopic)
			if err != nil {
				t.Error(err)
				return
			}
			lctx := lane.WithLane(ctx, l)
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			steps := int(churnPublish / (50 * time.Millisecond))
			for k := range churnPerLane {
				if k > 0 && k%(churnPerLane/steps+1) == 0 {
					<-tick.C
				}
				select {
				case <-enough:
					return
				default:
				}
				id := fmt.Sprintf("p%d-%d", i, k)
				var ack *jetstream.PubAck
				first := time.Now()
				var sent time.Time // when the acknowledged attempt was sent
				for deadline := first.Add(churnPatience); ; {
					sent = time.Now()
					actx, cancel := context.WithTimeout(lctx, 2*time.Second)
					ack, err = p.Publish(actx, "msg", []byte(id), jetstream.WithMsgID(id))
					cancel()
					if err == nil || time.Now().After(deadline) {
						break
					}
					time.Sleep(50 * time.Millisecond) // a NATS server is down: the same id again
				}
				if err != nil {
					t.Errorf("publish %s: %v", id, err)
					return
				}
				now := time.Now()
				ch.acked(sent, now)
				pmu.Lock()
				published = append(published, pub{id, l, ack.Sequence})
				longestPublish = max(longestPublish, now.Sub(first))
				pmu.Unlock()
			}
		}()
	}

	// Churn: in each lane, a consumer comes and goes, one at a time.
	producing := make(chan struct{})
	var cwg sync.WaitGroup
	if faults != nil {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			faults(ch, js, producing)
			if !sleepOr(producing, churnSettle) {
				ch.t.Logf("faults over; the producers stop")
			}
			close(enough)
		}()
	}
	for i, l := range churnLanes {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			for n := 1; ; n++ {
				if sleepOr(producing, time.Duration(rng.Int64N(int64(1500*time.Millisecond)))) {
					return
				}
				c := ch.start(fmt.Sprintf("%s-%d", l, n), l)
				sleepOr(producing, 300*time.Millisecond+time.Duration(rng.Int64N(int64(2500*time.Millisecond))))
				ch.stop(c, rng.IntN(2) == 0)
				select {
				case <-producing:
					return
				default:
				}
			}
		}()
	}
	wg.Wait()
	pubDone := time.Now()
	close(producing)
	cwg.Wait()
	t.Logf("published %d messages in %v; the longest publish took %v", len(published), pubDone.Sub(begin).Round(time.Millisecond), longestPublish.Round(time.Millisecond))

	// Wait until every published message has been handled.
	// Messages are known by their ids, not their stream sequences: a stream
	// leader killed before an acknowledged message reached the others may
	// see its sequence given to another message.
	want := map[string]string{}
	for _, p := range published {
		want[p.msg] = p.lane
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		ch.mu.Lock()
		seen := map[string]bool{}
		for _, h := range ch.handled {
			seen[h.msg] = true
		}
		ch.mu.Unlock()
		missing := 0
		for msg := range want {
			if !seen[msg] {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%d of %d messages never handled", missing, len(want))
			ch.explainMissing(js, published, seen)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	allDone := time.Now()
	// Late redeliveries would show up now.
	time.Sleep(churnAckWait + time.Second)
	for _, b := range bases {
		ch.stop(b, false)
	}
	ch.readers.Wait()

	ch.analyse(want, pubDone)
	t.Logf("all handled %v after the last publish; total %v", allDone.Sub(pubDone).Round(time.Millisecond), time.Since(begin).Round(time.Millisecond))
}

// pub is a message a churn producer published.
type pub struct {
	msg  string
	lane string
	seq  uint64 // the stream sequence of its (last) acknowledgement
}

// explainMissing logs, for the first few published messages never
// handled, whether the stream still holds them at the sequence their
// acknowledgement gave, and the state of their lane's durable: the
// difference between a message the servers lost and one left unconsumed.
func (ch *churn) explainMissing(js jetstream.JetStream, published []pub, seen map[string]bool) {
	t := ch.t
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, churnTopic)
	if err != nil {
		t.Logf("cannot look at the stream: %v", err)
		return
	}
	if info, err := stream.Info(ctx); err == nil {
		t.Logf("stream: %d messages, sequences %d to %d, leader %s", info.State.Msgs, info.State.FirstSeq, info.State.LastSeq, leaderOf(info.Cluster))
	}
	lanes := map[string]bool{}
	n := 0
	for _, p := range published {
		if seen[p.msg] {
			continue
		}
		if n++; n > 5 {
			break
		}
		lanes[p.lane] = true
		held := "no message there"
		if m, err := stream.GetMsg(ctx, p.seq); err != nil {
			held = err.Error()
		} else if string(m.Data) == p.msg {
			held = "held there"
		} else {
			held = fmt.Sprintf("%q there instead", m.Data)
		}
		t.Logf("never handled: %s of lane %q, acknowledged as sequence %d: %s", p.msg, p.lane, p.seq, held)
	}
	for l := range lanes {
		name := lanesnats.ConsumerName("g", lanesnats.Token(l))
		cons, err := stream.Consumer(ctx, name)
		if err != nil {
			t.Logf("durable %s: %v", name, err)
			continue
		}
		if ci, err := cons.Info(ctx); err == nil {
			t.Logf("durable %s: pending %d, ack pending %d, redelivered %d, waiting pulls %d, delivered up to %d, ack floor %d, leader %s",
				name, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.NumWaiting, ci.Delivered.Stream, ci.AckFloor.Stream, leaderOf(ci.Cluster))
		}
	}
}

func leaderOf(c *jetstream.ClusterInfo) string {
	if c == nil {
		return "(not clustered)"
	}
	return c.Leader
}

// analyse checks what the children reported and logs the figures.
func (ch *churn) analyse(want map[string]string, pubDone time.Time) {
	t := ch.t
	byID := map[string]*child{}
	for _, c := range ch.children {
		byID[c.id] = c
	}
	byMsg := map[string][]handling{}
	for _, h := range ch.handled {
		byMsg[h.msg] = append(byMsg[h.msg], h)
	}
	window := churnAckWait + churnTTL + 3*time.Second // documented bound, plus slack for -race on 2 loaded cores
	const settle = 3 * time.Second                    // a lane consumer ready this long has its lane to itself
	var dups, badLane, strayDup, steady, lost, redelivered, serverDups int
	var longestDup, longestServerDup, earliestServerDup time.Duration
	for msg, l := range want {
		hs := byMsg[msg]
		if len(hs) == 0 {
			lost++
			continue
		}
		sort.Slice(hs, func(i, j int) bool { return hs[i].at.Before(hs[j].at) })
		for j, h := range hs {
			c := byID[h.id]
			if h.n > 1 {
				redelivered++
			}
			if h.tok != lanesnats.Token(l) || (c.lane != "" && c.lane != l) {
				badLane++
				if badLane <= 5 {
					t.Errorf("message %s (seq %d) of lane %q handled by %s (lane %q) as lane token %q", msg, h.seq, l, h.id, c.lane, h.tok)
				}
			}
			if c.lane == "" && l != "" {
				for _, o := range ch.children {
					if o.lane == l && !o.readyAt.IsZero() && o.readyAt.Before(h.at.Add(-settle)) && (o.stopAt.IsZero() || o.stopAt.After(h.at)) {
						steady++
						if steady <= 5 {
							t.Errorf("message %s of lane %s handled by %s at %v while %s had been ready since %v",
								msg, l, h.id, h.at.Format("15:04:05.000"), o.id, o.readyAt.Format("15:04:05.000"))
						}
						break
					}
				}
			}
			if j == 0 {
				continue
			}
			dups++
			prev := byID[hs[j-1].id]
			if k, ok := ch.serverKillBefore(hs[j-1].at, h.at); ok {
				serverDups++
				longestServerDup = max(longestServerDup, h.at.Sub(k))
				earliestServerDup = max(earliestServerDup, k.Sub(hs[j-1].at))
				continue
			}
			// A killed child may handle a message between the test's
			// decision (stopAt) and the signal's delivery; not after it
			// exited.
			if !prev.killed || hs[j-1].at.After(prev.exitedAt) {
				strayDup++
				if strayDup <= 5 {
					t.Errorf("message %s handled again by %s at %v; first by %s at %v (killed %v, stopped %v)", msg, h.id, h.at.Format("15:04:05.000"),
						prev.id, hs[j-1].at.Format("15:04:05.000"), prev.killed, prev.stopAt.Format("15:04:05.000"))
				}
				continue
			}
			d := h.at.Sub(prev.stopAt)
			longestDup = max(longestDup, d)
			if d > window+ch.slackAt(h.at) {
				strayDup++
				t.Errorf("message %s handled again %v after %s was killed, outside the window of %v", msg, d, prev.id, window)
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d messages lost", lost)
	}
	// Hand-offs: after a lane consumer stops, how long until another
	// consumer handles a message of that lane.
	var longestKill, longestTerm time.Duration
	for _, c := range ch.children {
		if c.lane == "" || c.stopAt.IsZero() || c.stopAt.After(pubDone) {
			continue
		}
		var first time.Time
		for _, h := range ch.handled {
			if h.tok == c.lane && h.id != c.id && !h.at.Before(c.stopAt) && (first.IsZero() || h.at.Before(first)) {
				first = h.at
			}
		}
		if first.IsZero() {
			continue
		}
		if d := first.Sub(c.stopAt); c.killed {
			longestKill = max(longestKill, d)
		} else {
			longestTerm = max(longestTerm, d)
		}
	}
	unique := len(byMsg)
	t.Logf("published %d, handled %d (%d handlings), duplicates %d, lost %d; handled on a redelivery %d", len(want), unique, len(ch.handled), dups, lost, redelivered)
	t.Logf("lane consumers started %d, stopped gracefully %d, killed %d (plus 2 baseline consumers throughout)", ch.starts-2, ch.terms-2, ch.kills)
	if len(ch.serverKills) > 0 {
		var took []string
		for _, k := range ch.serverKills {
			if k.recovered.IsZero() {
				took = append(took, "never")
			} else {
				took = append(took, k.recovered.Sub(k.at).Round(time.Millisecond).String())
			}
		}
		t.Logf("NATS servers killed %d; the stream took publishes again after %s; duplicates after a server kill %d, the latest %v after it, first handled up to %v before it",
			len(ch.serverKills), strings.Join(took, ", "), serverDups, longestServerDup.Round(time.Millisecond), earliestServerDup.Round(time.Millisecond))
	}
	t.Logf("longest hand-off after a kill %v, after a graceful stop %v; latest duplicate %v after its kill (window %v)",
		longestKill.Round(time.Millisecond), longestTerm.Round(time.Millisecond), longestDup.Round(time.Millisecond), window)
	if badLane > 0 || steady > 0 || strayDup > 0 {
		t.Errorf("wrong lane %d, baseline handling a served lane %d, duplicates outside a hand-off %d", badLane, steady, strayDup)
	}
}

// electionSlack is how long after the stream's recovery from a NATS
// server's kill (the first publish acknowledged after it) the cluster may
// take, on a loaded 2-core machine, to elect new leaders of the durables and
// to deliver again what the dead server held: the hand-off windows widen by
// it from the kill to that long after the recovery.
const electionSlack = 20 * time.Second

// serverKillBefore returns the NATS server kill that explains a second
// handling at again of a message first handled at first: the server died
// with the first handling's ack, the ack was sent while no server led the
// durable, or the durable's new leader did not have the ack. So first was
// before the kill or during the elections after it (until electionSlack
// after the stream's recovery), and again after the kill.
//
// Neither first nor again is bounded further. With nats-server 2.9.10, a
// durable's new leader once delivered again, 9s after the second of two
// SIGKILLs of a stream leader, two messages acknowledged more than a second
// before the first kill (15s before); and under a load of 13, duplicates
// came 28s after a kill whose stream had recovered in 6.5s: a durable's
// election has no bound of its own. A lost ack of lanes' own would have
// brought the message back within AckWait of its first handling, and a
// first handling long after the elections is not excused.
func (ch *churn) serverKillBefore(first, again time.Time) (time.Time, bool) {
	for _, k := range slices.Backward(ch.serverKills) { // the latest kill that explains it
		if first.Before(k.end().Add(electionSlack)) && again.After(k.at) {
			return k.at, true
		}
	}
	return time.Time{}, false
}

// slackAt is how much the hand-off window widens at t: from a NATS
// server's kill to electionSlack after the stream's recovery, by the
// outage and electionSlack; nothing otherwise.
func (ch *churn) slackAt(t time.Time) time.Duration {
	for _, k := range ch.serverKills {
		if end := k.end(); !t.Before(k.at) && t.Before(end.Add(electionSlack)) {
			return end.Sub(k.at) + electionSlack
		}
	}
	return 0
}

func sleepOr(stop <-chan struct{}, d time.Duration) (stopped bool) {
	select {
	case <-stop:
		return true
	case <-time.After(d):
		return false
	}
}

func atoi(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
