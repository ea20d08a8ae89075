package lanesamqp

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"

	"github.com/lanesdev/lanes/internal/lib/mqlane"
	"github.com/lanesdev/lanes/lane"
)

// A reader consumes one lane's queue on a connection of its own, with
// manual acks, and hands the messages to the handler one at a time, in
// order. Stopping cancels the consumer at the broker, handles what was
// received (within the drain timeout) and closes the connection: the
// broker gives back what is left unacknowledged. A lost connection is
// dialled again.
type reader struct {
	*mqlane.Run
	c     *Consumer
	queue string

	// The handled messages whose ack is held back (see ack): held of them,
	// the last of which is last.
	held int
	last *amqp.Delivery
}

// maxHeldAcks bounds how many handled messages one ack settles.
const maxHeldAcks = 64

// consume is the body of lane run's consumption (mqlane.Runs).
func (c *Consumer) consume(run *mqlane.Run) {
	r := &reader{Run: run, c: c, queue: Queue(c.cfg.Topic, c.cfg.Service, c.cfg.Group, run.Lane)}
	const minBackoff, maxBackoff = 50 * time.Millisecond, 2 * time.Second
	backoff := minBackoff
	for r.Poll.Err() == nil {
		if err := r.session(); err != nil && r.Poll.Err() == nil {
			c.log.Warn("lanes: consuming a lane's queue failed; retrying", "queue", r.queue, "err", err)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-r.Poll.Done():
				t.Stop()
			}
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		backoff = minBackoff
	}
}

// session consumes the queue on one connection until it is lost or the
// reader stops.
func (r *reader) session() error {
	c := r.c
	dctx, cancel := context.WithTimeout(r.Poll, apiTimeout)
	conn, err := c.cfg.Dial(dctx)
	cancel()
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := declareGroup(ch, c.cfg.Topic, c.cfg.Service, c.cfg.Group, r.Lane); err != nil {
		return err
	}
	if err := c.announce(ch, r.Lane); err != nil {
		return err
	}
	if err := ch.Qos(c.o.prefetch, 0, false); err != nil {
		return err
	}
	const tag = "lanes"
	deliveries, err := ch.Consume(r.queue, tag, false, false, false, false, nil)
	if err != nil {
		return err
	}
	var mover *amqp.Channel // confirm channel for moves and dead letters, opened on demand
	defer func() {
		if mover != nil {
			mover.Close()
		}
	}()
	defer func() {
		r.flushAcks() // before the connection closes: the messages handled are settled
		r.held, r.last = 0, nil
	}()
	side := func() (*amqp.Channel, error) {
		if mover != nil && !mover.IsClosed() {
			return mover, nil
		}
		m, err := conn.Channel()
		if err == nil {
			err = m.Confirm(false)
		}
		if err != nil {
			return nil, err
		}
		mover = m
		return m, nil
	}
	pollDone := r.Poll.Done()
	stopConsuming := func() {
		pollDone = nil
		// Deliveries closes once the broker has confirmed the cancel;
		// what it sent before is handled first.
		ch.Cancel(tag, false)
	}
	for {
		var (
			d  amqp.Delivery
			ok bool
		)
		select {
		case d, ok = <-deliveries:
		case <-pollDone:
			stopConsuming()
			continue
		default:
			// Nothing waits: the messages handled are acknowledged before
			// the reader waits for more (see ack).
			if err := r.flushAcks(); err != nil {
				return err
			}
			select {
			case d, ok = <-deliveries:
			case <-pollDone:
				stopConsuming()
				continue
			}
		}
		if !ok {
			if r.Poll.Err() != nil {
				return nil
			}
			return errors.New("the broker closed the consumer")
		}
		if !r.handle(ch, side, &d) {
			return nil // draining timed out, or aborted: closing gives the rest back
		}
	}
}

// handle handles d until it is settled and reports whether the reader may
// go on. A message of lane L in the baseline queue (its lane had no queue
// yet) makes L's queue exist; it is handled here when this consumer owns L,
// and moved to L's queue otherwise.
func (r *reader) handle(ch *amqp.Channel, side func() (*amqp.Channel, error), m *amqp.Delivery) bool {
	c := r.c
	if r.Handle.Err() != nil || r.Aborted() {
		return false
	}
	l := r.Lane
	if r.Lane == "" {
		if v, _ := m.Headers[laneHeader].(string); v != "" && lane.Valid(v) {
			l = v
			if err := r.adopt(ch, side, m, l); err != nil {
				c.log.Warn("lanes: cannot hand a lane's message on; it is delivered again", "lane", l, "err", err)
				m.Nack(false, true)
				return false
			} else if !c.ownsLane(l) {
				return true // moved
			}
		}
	}
	d := &Delivery{Lane: l, Subject: m.RoutingKey, Body: m.Body, Headers: m.Headers, Redelivered: m.Redelivered, Msg: m}
	hctx := r.Handle // in the run's lane
	if l != r.Lane {
		hctx = lane.WithLane(r.Handle, l)
	}
	for attempt := 1; ; attempt++ {
		if r.Handle.Err() != nil {
			return false
		}
		d.Attempt = attempt
		err := r.call(hctx, d)
		if r.Handle.Err() != nil || r.Aborted() {
			return false
		}
		if err == nil {
			if err := r.ack(m); err != nil {
				return false // the connection is gone: the message comes back
			}
			c.handled.Add(1)
			return true
		}
		c.failed.Add(1)
		if r.flushAcks() != nil { // the messages before this one are not held back by its retries
			return false
		}
		if IsPermanent(err) || attempt >= c.o.maxDeliver {
			return r.deadLetter(side, d, err)
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

// ack acknowledges m, handled. The ack is held back while the next
// deliveries are there at once (up to the prefetch): one ack of the last
// message handled then settles it and those before it (AMQP's multiple
// ack), up to maxHeldAcks of them, sent when no delivery waits, before a
// handler's retry, and when the session ends. A consumer that keeps up
// sends one ack a message, as before; one that falls behind, one a batch.
// The messages are handled in order, so every delivery up to the last is
// settled when the multiple ack goes: acknowledged here, moved or
// dead-lettered (each acknowledged alone), or given back, which ends the
// session.
func (r *reader) ack(m *amqp.Delivery) error {
	r.held++
	r.last = m
	if r.held < maxHeldAcks {
		return nil
	}
	return r.flushAcks()
}

// flushAcks sends the ack of the messages held back, unless the consumer
// was aborted: as a crash would, it then leaves them to the broker.
func (r *reader) flushAcks() error {
	if r.held == 0 || r.Aborted() {
		return nil
	}
	err := r.last.Ack(true)
	r.held, r.last = 0, nil
	return err
}

// ownsLane reports whether this consumer owns lane l now.
func (c *Consumer) ownsLane(l string) bool {
	return mqlane.Owns(c.engine, c.m.Svc, mqlane.Self(c.m.Svc, c.inst.ID), l)
}

// adopt declares lane l's queue for a message of l found in the baseline
// queue, indexes it, and, unless this consumer owns l, moves the message
// there (published with a confirm, then acknowledged here).
func (r *reader) adopt(ch *amqp.Channel, side func() (*amqp.Channel, error), m *amqp.Delivery, l string) error {
	c := r.c
	if err := declareGroup(ch, c.cfg.Topic, c.cfg.Service, c.cfg.Group, l); err != nil {
		return err
	}
	if err := c.announce(ch, l); err != nil {
		return err
	}
	if c.ownsLane(l) {
		return nil
	}
	mc, err := side()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Handle, apiTimeout)
	defer cancel()
	dc, err := mc.PublishWithDeferredConfirmWithContext(ctx, "", Queue(c.cfg.Topic, c.cfg.Service, c.cfg.Group, l), false, false, publishingOf(m))
	if err != nil {
		return err
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		return fmt.Errorf("move to lane %s: confirmed %v: %v", l, ok, err)
	}
	if err := m.Ack(false); err != nil {
		return err // handled twice at worst: the copy is in the lane's queue
	}
	c.moved.Add(1)
	return nil
}

// publishingOf is the message of d, to publish again.
func publishingOf(d *amqp.Delivery) amqp.Publishing {
	return amqp.Publishing{Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: amqp.Persistent,
		Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, Expiration: d.Expiration, MessageId: d.MessageId,
		Timestamp: d.Timestamp, Type: d.Type, UserId: d.UserId, AppId: d.AppId, Body: d.Body}
}

// call runs the handler in a span, turning a panic into an error.
func (r *reader) call(ctx context.Context, d *Delivery) (err error) {
	c := r.c
	if c.tracer != nil {
		sctx, sp := mqlane.StartConsumerSpan(mqlane.ExtractTraceFrom(ctx, tableCarrier(d.Headers)), c.tracer, c.engine, c.inst,
			c.cfg.Topic, "rabbitmq", r.queue, d.Lane, int64(d.Attempt))
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
			c.log.Error("lanes: handler panicked", "queue", r.queue, "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return c.h.HandleMessage(ctx, d)
}

// deadLetter moves d to the group's dead-letter queue and reports whether
// the reader may go on.
func (r *reader) deadLetter(side func() (*amqp.Channel, error), d *Delivery, cause error) bool {
	c := r.c
	q := GroupExchange(c.cfg.Topic, c.cfg.Service, c.cfg.Group) + "..dlq"
	mc, err := side()
	if err == nil {
		_, err = mc.QueueDeclare(q, true, false, false, false, nil)
	}
	if err == nil {
		msg := publishingOf(d.Msg)
		msg.Headers = amqp.Table{}
		for k, v := range d.Headers {
			msg.Headers[k] = v
		}
		msg.Headers["lanes-error"] = truncate(cause.Error(), 1024)
		ctx, cancel := context.WithTimeout(r.Handle, apiTimeout)
		var dc *amqp.DeferredConfirmation
		if dc, err = mc.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, msg); err == nil {
			if ok, werr := dc.WaitContext(ctx); werr != nil || !ok {
				err = fmt.Errorf("not confirmed: %v", werr)
			}
		}
		cancel()
	}
	if err != nil {
		c.log.Warn("lanes: cannot dead-letter a message; it is delivered again", "queue", q, "err", err)
		d.Msg.Nack(false, true)
		return false
	}
	d.Msg.Ack(false)
	c.deadLettered.Add(1)
	c.log.Warn("lanes: message dead-lettered", "queue", q, "err", cause)
	return true
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// tableCarrier reads AMQP headers as a propagation.TextMapCarrier.
type tableCarrier amqp.Table

var _ propagation.TextMapCarrier = tableCarrier(nil)

func (t tableCarrier) Get(key string) string {
	for k, v := range t {
		if s, ok := v.(string); ok && strings.EqualFold(k, key) {
			return s
		}
	}
	return ""
}
func (t tableCarrier) Set(string, string) {}
func (t tableCarrier) Keys() []string {
	out := make([]string, 0, len(t))
	for k := range t {
		out = append(out, k)
	}
	return out
}

// Permanent wraps err so that the handler's failure sends the message to
// the dead-letter queue at once.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &mqlane.Permanent{Err: err}
}

// IsPermanent reports whether err was wrapped with Permanent.
func IsPermanent(err error) bool { return mqlane.IsPermanent(err) }
