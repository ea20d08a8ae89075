package lanesnats_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lanesdev/lanes/internal/testkit/benchcpu"
	"github.com/lanesdev/lanes/internal/testkit/natstest"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesnats"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// BenchmarkThroughput publishes b.N messages (128 bytes) asynchronously
// and consumes them with explicit acks, on an embedded JetStream server with
// the stream of lanesnats.StreamConfig (file storage), a connection for the
// producer and one for the consumer:
//
//   - lanes: a Publisher in lane alice, and a Consumer in lane alice (the
//     message carries the x-lane and baggage headers; the consumer pulls its
//     lane's durable in batches of 256 and acks each message);
//   - raw: jetstream PublishMsgAsync with no headers, and a durable pull
//     consumer's Consume callback that acks each message;
//   - raw-headers: raw, with the same two headers as lanes: what the
//     headers cost NATS;
//   - lanes-msgid: lanes, with a Nats-Msg-Id on every message
//     (WithMsgIDs), to show what the stream's deduplication costs.
//
// ns/op is the time per message from the first publish to the last ack;
// msgs/s is its inverse; cpu-ns/msg the CPU time of the process (server and
// clients) per message. docs/mq.md quotes the ratios.
func BenchmarkThroughput(b *testing.B) {
	srv := natstest.Embedded(b)
	payload := make([]byte, 128)
	var run int
	stream := func(b *testing.B, js jetstream.JetStream) string {
		run++
		topic := fmt.Sprintf("bench%d", run)
		if _, err := js.CreateStream(context.Background(), lanesnats.StreamConfig(topic)); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { js.DeleteStream(context.Background(), topic) })
		return topic
	}
	// report reports the messages per second, and the CPU time of the
	// process per message (cpu-ns/msg): the server's, the producer's and
	// the consumer's work, which a loaded machine disturbs less than the
	// wall time.
	report := func(b *testing.B, start time.Time, cpu time.Duration) {
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		if cpu > 0 {
			b.ReportMetric(float64(benchcpu.Process()-cpu)/float64(b.N), "cpu-ns/msg")
		}
	}
	wait := func(b *testing.B, js jetstream.JetStream, done <-chan struct{}) {
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			b.Fatal("publishing did not complete")
		}
		select {
		case <-done:
		case <-time.After(time.Minute):
			b.Fatal("consuming did not complete")
		}
	}

	lanesRun := func(b *testing.B, popts ...lanesnats.PublisherOpt) {
		_, pjs := natstest.Connect(b, srv.URL())
		_, cjs := natstest.Connect(b, srv.URL())
		topic := stream(b, pjs)
		reg := registry.NewMemory()
		defer reg.Close()
		eng := routing.New(routing.WithRegistry(reg), routing.WithLogger(quiet()))
		defer eng.Close()
		var n atomic.Int64
		done := make(chan struct{})
		h := lanesnats.HandlerFunc(func(ctx context.Context, d *lanesnats.Delivery) error {
			if n.Add(1) == int64(b.N) {
				close(done)
			}
			return nil
		})
		c, err := lanesnats.NewConsumer(context.Background(), cjs, lanesnats.ConsumerConfig{
			Service: "bench", Group: "g", Topic: topic, Registry: reg, Engine: eng,
			Instance: registry.Instance{ID: "alice-1", Lane: "alice"},
		}, h, lanesnats.WithLogger(quiet()), lanesnats.WithEnv(func(string) string { return "" }))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		waitOwned(b, c, "alice")
		pub, err := lanesnats.NewPublisher(pjs, topic, popts...)
		if err != nil {
			b.Fatal(err)
		}
		ctx := lane.WithLane(context.Background(), "alice")
		b.ReportAllocs()
		b.ResetTimer()
		start, cpu := time.Now(), benchcpu.Process()
		for range b.N {
			publishAsync(b, pjs, func() error {
				_, err := pub.PublishMsgAsync(ctx, &nats.Msg{Subject: "msg", Data: payload})
				return err
			})
		}
		wait(b, pjs, done)
		b.StopTimer()
		report(b, start, cpu)
	}

	b.Run("lanes", func(b *testing.B) { lanesRun(b) })

	rawRun := func(b *testing.B, header nats.Header) {
		_, pjs := natstest.Connect(b, srv.URL())
		_, cjs := natstest.Connect(b, srv.URL())
		topic := stream(b, pjs)
		cons, err := cjs.CreateConsumer(context.Background(), topic, jetstream.ConsumerConfig{
			Durable: "g", FilterSubject: topic + ".alice.>", AckPolicy: jetstream.AckExplicitPolicy,
		})
		if err != nil {
			b.Fatal(err)
		}
		var n atomic.Int64
		done := make(chan struct{})
		cc, err := cons.Consume(func(m jetstream.Msg) {
			m.Ack()
			if n.Add(1) == int64(b.N) {
				close(done)
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Stop()
		subject := topic + ".alice.msg"
		b.ReportAllocs()
		b.ResetTimer()
		start, cpu := time.Now(), benchcpu.Process()
		for range b.N {
			publishAsync(b, pjs, func() error {
				_, err := pjs.PublishMsgAsync(&nats.Msg{Subject: subject, Data: payload, Header: header})
				return err
			})
		}
		wait(b, pjs, done)
		b.StopTimer()
		report(b, start, cpu)
	}

	b.Run("raw", func(b *testing.B) { rawRun(b, nil) })
	b.Run("raw-headers", func(b *testing.B) {
		rawRun(b, nats.Header{lane.Header: {"alice"}, lane.BaggageHeader: {"lane=alice"}})
	})
	b.Run("lanes-msgid", func(b *testing.B) { lanesRun(b, lanesnats.WithMsgIDs()) })
}

// publishAsync runs an asynchronous publish; when too many publishes await
// their acks (a loaded machine), it waits until they have them and tries
// again.
func publishAsync(b *testing.B, js jetstream.JetStream, publish func() error) {
	for {
		err := publish()
		if err == nil {
			return
		}
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			b.Fatal(err)
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			b.Fatal("publishing stalled")
		}
	}
}
