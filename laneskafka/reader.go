package laneskafka

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/codes"

	"github.com/lanesdev/lanes/internal/lib/mqlane"
)

// A reader consumes one lane's topic as a member of that lane's consumer
// group: it polls a batch, hands the records to the handler one at a time,
// in order, commits the offsets of those handled, and only then lets the
// group rebalance (kgo.BlockRebalanceOnPoll), so a partition that moves to
// another member starts after the last record handled here. Stopping ends
// the poll, finishes the batch (within the drain timeout), commits and
// leaves the group.
type reader struct {
	*mqlane.Run
	c   *Consumer
	kt  string
	gid string
}

// consume is the body of lane run's consumption (mqlane.Runs).
func (c *Consumer) consume(run *mqlane.Run) {
	r := &reader{Run: run, c: c, kt: LaneTopic(c.cfg.Topic, run.Lane), gid: GroupID(c.cfg.Service, c.cfg.Group, run.Lane)}
	r.loop()
}

func (r *reader) loop() {
	c := r.c
	// The lane's topic may not exist yet (a lane that has a consumer but no
	// message): create it, so that the group can join.
	actx, cancel := context.WithTimeout(r.Poll, apiTimeout)
	if err := CreateTopic(actx, c.adm, r.kt, DefaultPartitions); err != nil && r.Poll.Err() == nil {
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
	for r.Poll.Err() == nil {
		fs := cl.PollRecords(r.Poll, c.o.batch)
		fs.EachError(func(t string, p int32, err error) {
			if r.Poll.Err() == nil && !errors.Is(err, context.Canceled) && !errors.Is(err, kgo.ErrClientClosed) {
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
		if len(settled) > 0 && !r.Aborted() {
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
	if r.Aborted() {
		cancel()
	}
	defer cancel()
	if err := cl.LeaveGroupContext(ctx); err != nil && !r.Aborted() {
		r.c.log.Warn("lanes: leaving a lane's group failed; the group notices after its session timeout", "group", r.gid, "err", err)
	}
	cl.Close()
}

// handle handles rec until it is settled: handled, or dead-lettered after
// the last allowed attempt. It returns false when draining timed out first.
func (r *reader) handle(rec *kgo.Record) bool {
	c := r.c
	d := &Delivery{Lane: r.Lane, Key: rec.Key, Value: rec.Value, Headers: rec.Headers, Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Record: rec}
	for attempt := 1; ; attempt++ {
		if r.Handle.Err() != nil {
			return false
		}
		d.Attempt = attempt
		err := r.call(d)
		if err == nil {
			return true
		}
		if r.Handle.Err() != nil {
			return false
		}
		c.failed.Add(1)
		if IsPermanent(err) || attempt >= c.o.maxDeliver {
			return r.deadLetter(d, err)
		}
		t := time.NewTimer(c.delay(attempt))
		select {
		case <-t.C:
		case <-r.Handle.Done():
			t.Stop()
			return false
		}
	}
}

// call runs the handler in a span, turning a panic into an error.
func (r *reader) call(d *Delivery) (err error) {
	c := r.c
	ctx := r.Handle
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
		ctx, cancel := context.WithTimeout(r.Handle, apiTimeout)
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
		if r.Handle.Err() != nil {
			return false
		}
		c.log.Warn("lanes: cannot dead-letter a message; retrying", "dead_letter_topic", dlt, "err", err)
		t := time.NewTimer(time.Second)
		select {
		case <-t.C:
		case <-r.Handle.Done():
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
	return &mqlane.Permanent{Err: err}
}

// IsPermanent reports whether err was wrapped with Permanent.
func IsPermanent(err error) bool { return mqlane.IsPermanent(err) }
