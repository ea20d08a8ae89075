package laneskafka_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneskafka"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// BenchmarkThroughput publishes b.N records (128 bytes) asynchronously and
// consumes them in a consumer group that commits after each polled batch,
// on kfake (or the broker of LANES_TEST_KAFKA), one client producing and
// one consuming:
//
//   - raw: kgo Produce with no headers, and a group consumer that polls
//     batches of 256, handles each record and commits the batch;
//   - raw-headers: raw, with the two lane headers on every record;
//   - lanes: a Publisher in lane alice (PublishRecordAsync: the x-lane and
//     baggage headers, the lane's topic), and a Consumer in lane alice
//     (batches of 256, committed after the handler returns).
//
// ns/op is the time per record from the first publish to the last record
// handled; docs/mq.md quotes the ratio.
func BenchmarkThroughput(b *testing.B) {
	seeds := brokers(b)
	payload := make([]byte, 128)
	var run int
	topic := func() string { run++; return fmt.Sprintf("bench%d", run) }
	newClient := func(b *testing.B, opts ...kgo.Opt) *kgo.Client {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...), kgo.MetadataMinAge(100 * time.Millisecond)}, opts...)...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(cl.Close)
		return cl
	}
	wait := func(b *testing.B, done <-chan struct{}) {
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			b.Fatal("consuming did not complete")
		}
	}
	report := func(b *testing.B, start time.Time) {
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	}

	rawRun := func(b *testing.B, headers []kgo.RecordHeader) {
		t := topic()
		pcl := newClient(b)
		if err := laneskafka.CreateTopic(context.Background(), kadm.NewClient(pcl), t, 1); err != nil {
			b.Fatal(err)
		}
		ccl := newClient(b, kgo.ConsumerGroup(t+"-raw"), kgo.ConsumeTopics(t), kgo.DisableAutoCommit(),
			kgo.BlockRebalanceOnPoll(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
		var n atomic.Int64
		done := make(chan struct{})
		ctx, cancel := context.WithCancel(context.Background())
		exited := make(chan struct{})
		handle := func(r *kgo.Record) {
			if n.Add(1) == int64(b.N) {
				close(done)
			}
		}
		go func() {
			defer close(exited)
			for ctx.Err() == nil {
				recs := ccl.PollRecords(ctx, 256).Records()
				for _, r := range recs {
					handle(r)
				}
				if len(recs) > 0 {
					ccl.CommitRecords(context.Background(), recs...)
				}
				ccl.AllowRebalance()
			}
		}()
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			pcl.Produce(context.Background(), &kgo.Record{Topic: t, Value: payload, Headers: headers}, nil)
		}
		wait(b, done)
		report(b, start)
		b.StopTimer()
		cancel()
		<-exited
	}
	b.Run("raw", func(b *testing.B) { rawRun(b, nil) })
	b.Run("raw-headers", func(b *testing.B) {
		rawRun(b, []kgo.RecordHeader{{Key: lane.Header, Value: []byte("alice")}, {Key: lane.BaggageHeader, Value: []byte(lane.BaggageKey + "=alice")}})
	})

	b.Run("lanes", func(b *testing.B) {
		t := topic()
		pcl := newClient(b)
		pub, err := laneskafka.NewPublisher(pcl, t)
		if err != nil {
			b.Fatal(err)
		}
		reg := registry.NewMemory()
		defer reg.Close()
		eng := routing.New(routing.WithRegistry(reg), routing.WithLogger(quiet()))
		defer eng.Close()
		var n atomic.Int64
		done := make(chan struct{})
		ctx := lane.WithLane(context.Background(), "alice")
		// Create the lane's topic before the clock starts, as raw does.
		if err := laneskafka.CreateTopic(ctx, kadm.NewClient(pcl), laneskafka.LaneTopic(t, "alice"), 1); err != nil {
			b.Fatal(err)
		}
		c, err := laneskafka.NewConsumer(context.Background(), laneskafka.ConsumerConfig{
			Service: "billing", Group: "invoices", Topic: t, Registry: reg, Engine: eng,
			ClientOpts: []kgo.Opt{kgo.SeedBrokers(seeds...), kgo.FetchMaxWait(200 * time.Millisecond)},
			Instance:   registry.Instance{ID: "alice", Lane: "alice"},
		}, laneskafka.HandlerFunc(func(ctx context.Context, d *laneskafka.Delivery) error {
			if n.Add(1) == int64(b.N) {
				close(done)
			}
			return nil
		}), testOpts()...)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			if err := pub.PublishRecordAsync(ctx, &kgo.Record{Value: payload}, nil); err != nil {
				b.Fatal(err)
			}
		}
		wait(b, done)
		report(b, start)
		b.StopTimer()
	})
}
