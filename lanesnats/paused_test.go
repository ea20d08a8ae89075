//go:build unix

package lanesnats_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/internal/testkit/natstest"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesnats"
)

// TestPausedConsumerHandlesOnce: a consumer process paused (SIGSTOP) while
// it holds buffered messages past their AckWait finds, when it resumes,
// both its buffered copies and the copies JetStream delivered again
// meanwhile. It handles each message once: the late copies of what it has
// just acknowledged are acknowledged again, not handled.
func TestPausedConsumerHandlesOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("pauses a consumer process for a few seconds")
	}
	ns := natstest.Embedded(t)
	etcd := etcdtest.Embedded(t)
	_, js := natstest.Connect(t, ns.URL())
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, lanesnats.StreamConfig(churnTopic)); err != nil {
		t.Fatal(err)
	}
	ch := &churn{t: t, natsURL: ns.URL(), etcd: etcd.Endpoints()[0]}
	const n = 64 // what the consumer pulls at once (two batches of 32): it holds them all
	p, err := lanesnats.NewPublisher(js, churnTopic)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		id := fmt.Sprintf("m-%d", i)
		if _, err := p.Publish(lane.WithLane(ctx, ""), "msg", []byte(id), jetstream.WithMsgID(id)); err != nil {
			t.Fatal(err)
		}
	}
	c := ch.start("paused", "")
	handled := func() int {
		ch.mu.Lock()
		defer ch.mu.Unlock()
		return len(ch.handled)
	}
	waitFor(t, 30*time.Second, "the first message handled", func() bool { return handled() > 0 })
	if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := handled()
	cons, err := js.Consumer(ctx, churnTopic, lanesnats.ConsumerName("g", lanesnats.Token("")))
	if err != nil {
		t.Fatal(err)
	}
	// Past the held messages' AckWait, JetStream delivers them to whoever
	// pulls: the test pulls them and gives them back (a negative ack), so
	// that they wait for the consumer's next pull beside its buffered
	// copies, as when a starved process pulls again before it has worked
	// through what it buffered. (A message the consumer had not been given
	// yet, the test leaves unacknowledged: it comes back after AckWait.)
	var back int
	waitFor(t, 60*time.Second, "the held messages delivered again", func() bool {
		batch, err := cons.Fetch(n, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return false
		}
		for m := range batch.Messages() {
			if meta, err := m.Metadata(); err == nil && meta.NumDelivered > 1 {
				back++
				m.Nak()
			}
		}
		return back > 0
	})
	if err := c.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "every message acknowledged", func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0
	})
	ch.stop(c, false)
	ch.readers.Wait()

	times := map[string]int{}
	for _, h := range ch.handled {
		times[h.msg]++
	}
	twice := 0
	for msg, k := range times {
		if k > 1 {
			if twice++; twice <= 5 {
				t.Errorf("%s handled %d times by the one consumer", msg, k)
			}
		}
	}
	if len(times) != n {
		t.Errorf("%d of %d messages handled", len(times), n)
	}
	t.Logf("%d handled before the pause, %d held messages delivered again, %d handlings in all, %d messages handled twice", stopped, back, len(ch.handled), twice)
}
