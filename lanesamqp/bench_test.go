package lanesamqp_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lanesdev/lanes/internal/testkit/amqptest"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesamqp"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// BenchmarkThroughput publishes b.N persistent messages (128 bytes) with
// publisher confirms, waited for in windows of 256, and consumes them with
// manual acks and a prefetch of 256, on a rabbitmq-server process, one
// connection producing and one consuming:
//
//   - raw: amqp091 to a durable queue through the default exchange, and a
//     consumer that acks each message;
//   - lanes: a Publisher in lane alice (the topic's fanout exchange, the
//     group's headers exchange, the lane's queue), and a Consumer in lane
//     alice.
//
// ns/op is the time per message from the first publish to the last ack;
// docs/mq.md quotes the ratio.
func BenchmarkThroughput(b *testing.B) {
	broker := amqptest.Start(b)
	payload := make([]byte, 128)
	var run int
	wait := func(b *testing.B, done <-chan struct{}) {
		select {
		case <-done:
		case <-time.After(5 * time.Minute):
			b.Fatal("consuming did not complete")
		}
	}
	// publish publishes b.N messages with pub, waiting for the confirms of
	// each window of 256.
	publish := func(b *testing.B, pub func() (*amqp.DeferredConfirmation, error)) {
		window := make([]*amqp.DeferredConfirmation, 0, 256)
		flush := func() {
			for _, dc := range window {
				if !dc.Wait() {
					b.Fatal("not confirmed")
				}
			}
			window = window[:0]
		}
		for range b.N {
			dc, err := pub()
			if err != nil {
				b.Fatal(err)
			}
			if window = append(window, dc); len(window) == cap(window) {
				flush()
			}
		}
		flush()
	}
	report := func(b *testing.B, start time.Time) {
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	}

	b.Run("raw", func(b *testing.B) {
		run++
		q := fmt.Sprintf("bench-raw-%d", run)
		dial := dialer(broker.URL(), nil)
		pc, err := dial(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		defer pc.Close()
		cc, err := dial(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Close()
		pch, _ := pc.Channel()
		if err := pch.Confirm(false); err != nil {
			b.Fatal(err)
		}
		if _, err := pch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			b.Fatal(err)
		}
		cch, _ := cc.Channel()
		cch.Qos(256, 0, false)
		deliveries, err := cch.Consume(q, "raw", false, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		var n atomic.Int64
		done := make(chan struct{})
		exited := make(chan struct{})
		go func() {
			defer close(exited)
			for d := range deliveries {
				d.Ack(false)
				if n.Add(1) == int64(b.N) {
					close(done)
				}
			}
		}()
		b.ResetTimer()
		start := time.Now()
		publish(b, func() (*amqp.DeferredConfirmation, error) {
			return pch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false,
				amqp.Publishing{DeliveryMode: amqp.Persistent, Body: payload})
		})
		wait(b, done)
		report(b, start)
		b.StopTimer()
		cch.Cancel("raw", false)
		<-exited
	})

	b.Run("lanes", func(b *testing.B) {
		run++
		topic := fmt.Sprintf("bench%d", run)
		reg := registry.NewMemory()
		defer reg.Close()
		eng := routing.New(routing.WithRegistry(reg), routing.WithLogger(quiet()))
		defer eng.Close()
		pub, err := lanesamqp.NewPublisher(dialer(broker.URL(), nil), topic)
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		var n atomic.Int64
		done := make(chan struct{})
		c, err := lanesamqp.NewConsumer(context.Background(), lanesamqp.ConsumerConfig{
			Service: "billing", Group: "invoices", Topic: topic, Dial: dialer(broker.URL(), nil), Addr: broker.Addr(),
			Registry: reg, Engine: eng, Instance: registry.Instance{ID: "alice", Lane: "alice"},
		}, lanesamqp.HandlerFunc(func(ctx context.Context, d *lanesamqp.Delivery) error {
			if n.Add(1) == int64(b.N) {
				close(done)
			}
			return nil
		}), testOpts()...)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		// The consumer owns its lane once the engine has decided.
		for len(c.Owned()) == 0 {
			time.Sleep(10 * time.Millisecond) // polling the consumer's state before the clock starts
		}
		ctx := lane.WithLane(context.Background(), "alice")
		b.ResetTimer()
		start := time.Now()
		publish(b, func() (*amqp.DeferredConfirmation, error) {
			dc, _, err := pub.PublishMsgAsync(ctx, "created", amqp.Publishing{Body: payload})
			return dc, err
		})
		wait(b, done)
		report(b, start)
		b.StopTimer()
	})
}
