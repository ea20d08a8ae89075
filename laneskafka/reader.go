package laneskafka

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/codes"

	"github.com/lanesdev/lanes/internal/lib/mqlane"
	"github.com/lanesdev/lanes/lane"
)

// A reader consumes one lane's topic as a member of that lane's consumer
// group: it polls a batch, hands the records to the handler one at a time,
// in order, commits the offsets of those handled, and only then lets the
// group rebalance (kgo.BlockRebalanceOnPoll), so a partition that moves to
// another member starts after the last record handled here. Stopping ends
// the poll, finishes the batch (within the drain timeout), commits and
// leaves the group.
type reader struct {
	c      *Consumer
	lane   string
	kt     string
	gid    string
	prev   *reader // the lane's previous reader, to wait for
	done   chan struct{}
	poll   context.Context // cancelled to stop polling
	unpoll context.CancelFunc
	hctx   context.Context // the handlers', in the lane: cancelled when draining times out
	hstop  context.CancelFunc

	mu     sync.Mutex
	want   bool
	drain  *time.Timer
	exited bool
}

// newReader starts the reader of lane l. c.mu must be held.
func (c *Consumer) newReader(l string, prev *reader) *reader {
	r := &reader{c: c, lane: l, kt: LaneTopic(c.cfg.Topic, l), gid: GroupID(c.cfg.Service, c.cfg.Group, l),
		prev: prev, done: make(chan struct{}), want: true}
	r.poll, r.unpoll = context.WithCancel(context.Background())
	r.hctx, r.hstop = context.WithCancel(lane.WithLane(context.Background(), l))
	go r.loop() // owned by c: shutdown waits for done
	return r
}

// stop makes the reader stop polling, finish its batch and leave the group.
// It reports whether it was wanted.
func (r *reader) stop() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	was := r.want
	r.want = false
	r.unpoll()
	if r.c.aborted.Load() {
		r.hstop()
	} else if r.drain == nil && !r.exited {
		r.drain = time.AfterFunc(r.c.o.drain, r.hstop)
	}
	return was
}

func (r *reader) wanted() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.want
}

func (r *reader) finished() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (r *reader) loop() {
	defer close(r.done)
	defer func() {
		r.mu.Lock()
		r.exited = true
		if r.drain != nil {
			r.drain.Stop()
		}
		r.mu.Unlock()
		r.hstop()
	}()
	if r.prev != nil {
		<-r.prev.done
		r.prev = nil
	}
	c := r.c
	// The lane's topic may not exist yet (a lane that has a consumer but no
	// message): create it, so that the group can join.
	actx, cancel := context.WithTimeout(r.poll, apiTimeout)
	if err := CreateTopic(actx, c.adm, r.kt, DefaultPartitions); err != nil && r.poll.Err() == nil {
		c.log.Warn("lanes: cannot create a lane's topic; consuming it once it exists", "lane_topic", r.kt, "err", err)
	}
	cancel()
	opts := append(append([]kgo.Opt(nil), c.cfg.ClientOpts...),
		kgo.ConsumerGroup(r.gid), kgo.ConsumeTopics(r.kt), kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		c.log.Error("lanes: cannot make the Kafka client of a lane", "lane_topic", r.kt, "err", err)
		return
	}
	defer r.leave(cl)
	for r.poll.Err() == nil {
		fs := cl.PollRecords(r.poll, c.o.batch)
		fs.EachError(func(t string, p int32, err error) {
			if r.poll.Err() == nil && !errors.Is(err, context.Canceled) && !errors.Is(err, kgo.ErrClientClosed) {
				c.log.Warn("lanes: fetching a lane's records failed", "lane_topic", t, "partition", p, "err", err)
			}
		})
		recs := fs.Records()
		var settled []*kgo.Record
		for _, rec := range recs {
			if !r.handle(rec) {
				break // draining timed out: the rest is the next owner's
			}
			settled = append(settled, rec)
		}
		if len(settled) > 0 && !c.aborted.Load() {
			cctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
			if err := cl.CommitRecords(cctx, settled...); err != nil {
				c.log.Warn("lanes: commit failed; the records are handled again by the lane's next owner", "lane_topic", r.kt, "err", err)
			} else {
				c.handled.Add(uint64(len(settled)))
			}
			cancel()
		}
		cl.AllowRebalance()
	}
}

// leave leaves the group and closes the client: at once, without a
// goodbye, when the consumer was aborted.
func (r *reader) leave(cl *kgo.Client) {
	cl.AllowRebalance()
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	if r.c.aborted.Load() {
		cancel()
	}
	defer cancel()
	if err := cl.LeaveGroupContext(ctx); err != nil && !r.c.aborted.Load() {
		r.c.log.Warn("lanes: leaving a lane's group failed; the group notices after its session timeout", "group", r.gid, "err", err)
	}
	cl.Close()
}

// handle handles rec until it is settled: handled, or dead-lettered after
// the last allowed attempt. It returns false when draining timed out first.
func (r *reader) handle(rec *kgo.Record) bool {
	c := r.c
	d := &Delivery{Lane: r.lane, Key: rec.Key, Value: rec.Value, Headers: rec.Headers, Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Record: rec}
	for attempt := 1; ; attempt++ {
		if r.hctx.Err() != nil {
			return false
		}
		d.Attempt = attempt
		err := r.call(d)
		if err == nil {
			return true
		}
		if r.hctx.Err() != nil {
			return false
		}
		c.failed.Add(1)
		if IsPermanent(err) || attempt >= c.o.maxDeliver {
			return r.deadLetter(d, err)
		}
		t := time.NewTimer(c.delay(attempt))
		select {
		case <-t.C:
		case <-r.hctx.Done():
			t.Stop()
			return false
		}
	}
}

// call runs the handler in a span, turning a panic into an error.
func (r *reader) call(d *Delivery) (err error) {
	c := r.c
	ctx := r.hctx
	if c.tracer != nil {
		sctx, sp := mqlane.StartConsumerSpan(mqlane.ExtractTraceFrom(ctx, recordCarrier(d.Headers)), c.tracer, c.engine, c.inst, c.cfg.Topic, "kafka", d.Topic, d.Lane, int64(d.Attempt))
		ctx = sctx
		defer func() {
			if err != nil {
				sp.SetStatus(codes.Error, err.Error())
			}
			sp.End()
		}()
	}
	defer func() {
		if p := recover(); p != nil {
			c.log.Error("lanes: handler panicked", "lane_topic", d.Topic, "offset", d.Offset, "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return c.h.HandleMessage(ctx, d)
}

// deadLetter publishes d to the dead-letter topic, in its lane, and reports
// whether it is settled.
func (r *reader) deadLetter(d *Delivery, cause error) bool {
	c := r.c
	dlt := LaneTopic(DeadLetterTopic(c.cfg.Topic), d.Lane)
	for {
		ctx, cancel := context.WithTimeout(r.hctx, apiTimeout)
		err := CreateTopic(ctx, c.adm, dlt, DefaultPartitions)
		if err == nil {
			hs := append(append([]kgo.RecordHeader(nil), d.Record.Headers...), kgo.RecordHeader{Key: "lanes-error", Value: []byte(truncate(cause.Error(), 1024))})
			err = c.meta.ProduceSync(ctx, &kgo.Record{Topic: dlt, Key: d.Key, Value: d.Value, Headers: hs}).FirstErr()
		}
		cancel()
		if err == nil {
			c.deadLettered.Add(1)
			c.log.Warn("lanes: message dead-lettered", "lane_topic", d.Topic, "offset", d.Offset, "dead_letter_topic", dlt, "err", cause)
			return true
		}
		if r.hctx.Err() != nil {
			return false
		}
		c.log.Warn("lanes: cannot dead-letter a message; retrying", "dead_letter_topic", dlt, "err", err)
		t := time.NewTimer(time.Second)
		select {
		case <-t.C:
		case <-r.hctx.Done():
			t.Stop()
			return false
		}
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// DeadLetterTopic is the default dead-letter topic of a topic:
// "<topic>-dlq"; its lanes are topics too ("<topic>-dlq.<lane>").
func DeadLetterTopic(topic string) string { return topic + "-dlq" }

// Permanent wraps err so that the handler's failure sends the message to
// the dead-letter topic at once.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// IsPermanent reports whether err was wrapped with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}
