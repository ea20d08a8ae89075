package lanesamqp_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lanesdev/lanes/internal/testkit/amqptest"
	"github.com/lanesdev/lanes/internal/testkit/benchcpu"
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
//   - raw-headers: the same, the messages carrying the three headers of a
//     lanes message in lane alice (x-lane, baggage, lanes-lane);
//   - raw-topology: raw-headers through the exchanges lanes routes by (the
//     topic's fanout exchange, the group's headers exchange) to the lane's
//     queue: the broker's share of what lanes costs;
//   - lanes: a Publisher in lane alice (the topic's fanout exchange, the
//     group's headers exchange, the lane's queue), and a Consumer in lane
//     alice.
//
// ns/op is the time per message from the first publish to the last ack,
// cpu-ns/msg the CPU time of the benchmark's process per message,
// broker-cpu-ns/msg the broker's; docs/mq.md quotes the ratios.
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
	// started is when the clock started: the time, the CPU time of this
	// process and the broker's.
	type started struct {
		at          time.Time
		cpu, broker time.Duration
	}
	start := func() started {
		bcpu, _ := broker.CPUTime()
		return started{at: time.Now(), cpu: benchcpu.Process(), broker: bcpu}
	}
	// report reports the messages per second; the CPU time of this process
	// per message (cpu-ns/msg), the client's own work, producer and
	// consumer; and the broker's (broker-cpu-ns/msg), which runs in a
	// process of its own.
	report := func(b *testing.B, s started) {
		b.ReportMetric(float64(b.N)/time.Since(s.at).Seconds(), "msgs/s")
		if s.cpu > 0 {
			b.ReportMetric(float64(benchcpu.Process()-s.cpu)/float64(b.N), "cpu-ns/msg")
		}
		if bcpu, err := broker.CPUTime(); err == nil && s.broker > 0 {
			b.ReportMetric(float64(bcpu-s.broker)/float64(b.N), "broker-cpu-ns/msg")
		}
	}

	// rawCase publishes with amqp091 to exchange x with routing key key and
	// headers h, and consumes queue q; declare makes them.
	rawCase := func(declare func(b *testing.B, ch *amqp.Channel) (x, key, q string), h amqp.Table) func(b *testing.B) {
		return func(b *testing.B) {
			run++
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
			x, key, q := declare(b, pch)
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
			s := start()
			publish(b, func() (*amqp.DeferredConfirmation, error) {
				return pch.PublishWithDeferredConfirmWithContext(context.Background(), x, key, false, false,
					amqp.Publishing{DeliveryMode: amqp.Persistent, Headers: h, Body: payload})
			})
			wait(b, done)
			report(b, s)
			b.StopTimer()
			cch.Cancel("raw", false)
			<-exited
		}
	}
	// toQueue declares a durable queue, published to through the default
	// exchange.
	toQueue := func(b *testing.B, ch *amqp.Channel) (string, string, string) {
		q := fmt.Sprintf("bench-raw-%d", run)
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			b.Fatal(err)
		}
		return "", q, q
	}
	// The headers a lanes publisher writes for lane alice.
	laneHeaders := amqp.Table{lane.Header: "alice", lane.BaggageHeader: "lane=alice", lanesamqp.RouteHeader: "alice"}

	b.Run("raw", rawCase(toQueue, nil))
	b.Run("raw-headers", rawCase(toQueue, laneHeaders))
	// raw-topology: the exchanges and queue a lanes consumer of lane alice
	// declares (the topic's fanout exchange, the group's headers exchange,
	// the lane's queue bound by its header), and lanes' headers: what the
	// broker's routing costs, without lanes' code.
	b.Run("raw-topology", rawCase(func(b *testing.B, ch *amqp.Channel) (string, string, string) {
		topic := fmt.Sprintf("benchraw%d", run)
		if err := lanesamqp.DeclareGroup(ch, topic, "billing", "invoices", "alice"); err != nil {
			b.Fatal(err)
		}
		return lanesamqp.Exchange(topic), "created", lanesamqp.Queue(topic, "billing", "invoices", "alice")
	}, laneHeaders))

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
		s := start()
		publish(b, func() (*amqp.DeferredConfirmation, error) {
			dc, _, err := pub.PublishMsgAsync(ctx, "created", amqp.Publishing{Body: payload})
			return dc, err
		})
		wait(b, done)
		report(b, s)
		b.StopTimer()
	})
}
