package lanesnats

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Headers of a dead letter, besides the original message's own.
const (
	HeaderDLQGroup      = "Lanes-Dlq-Group"      // the consumer group that gave up
	HeaderDLQService    = "Lanes-Dlq-Service"    // its service
	HeaderDLQStream     = "Lanes-Dlq-Stream"     // the original stream
	HeaderDLQSeq        = "Lanes-Dlq-Seq"        // the original stream sequence
	HeaderDLQSubject    = "Lanes-Dlq-Subject"    // the original NATS subject
	HeaderDLQDeliveries = "Lanes-Dlq-Deliveries" // deliveries of the original
	HeaderDLQError      = "Lanes-Dlq-Error"      // the last handler error
)

// A fetcher fetches the messages of one lane token from its durable
// consumer and hands them to the handler, one at a time and in order. Its
// reader goroutine fetches (at most two batches ahead); its worker goroutine
// handles. Stopping lets the fetch in progress end by itself (never
// abandoning messages the server is sending), handles what was fetched, and
// exits.
type fetcher struct {
	c       *Consumer
	tok     string
	lane    string
	ackWait time.Duration
	ctx     context.Context // the handlers' context, in the lane
	cancel  context.CancelFunc
	prev    <-chan struct{} // the previous fetcher of the token, to wait for
	done    chan struct{}   // closed when the worker has exited
	wake    chan struct{}   // interrupts the reader's back-off sleeps

	mu         sync.Mutex
	cond       *sync.Cond
	cons       jetstream.Consumer
	queue      []held // fetched, not finished; queue[head] is being handled
	head       int
	wanted     bool
	readerDone bool
	workerDone bool
	drainTimer *time.Timer
}

type held struct {
	m       jetstream.Msg
	touched time.Time // delivered, or last extended
}

// newFetcher starts a fetcher of tok. c.mu must be held.
func (c *Consumer) newFetcher(tok string, cons jetstream.Consumer, prev <-chan struct{}) *fetcher {
	l, _ := tokenLane(tok) // a foreign token is handled as baseline
	ackWait := c.o.ackWait
	if info := cons.CachedInfo(); info != nil && info.Config.AckWait > 0 {
		ackWait = info.Config.AckWait // the durable's own, set by whoever created it
	}
	ctx, cancel := context.WithCancel(c.laneCtx(l))
	f := &fetcher{c: c, tok: tok, lane: l, ackWait: ackWait, ctx: ctx, cancel: cancel, prev: prev,
		done: make(chan struct{}), wake: make(chan struct{}, 1), cons: cons, wanted: true}
	f.cond = sync.NewCond(&f.mu)
	c.fwg.Add(2)
	go f.read()
	go f.work()
	return f
}

// stop makes the fetcher stop fetching and exit once it has handled what it
// holds (within the drain timeout). It reports whether it was wanted.
func (f *fetcher) stop() bool {
	f.mu.Lock()
	was := f.wanted
	f.wanted = false
	if f.drainTimer == nil && !f.workerDone {
		f.drainTimer = time.AfterFunc(f.c.o.drain, f.cancel)
	}
	f.cond.Broadcast()
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
	return was
}

// revive makes a stopping fetcher fetch again, if it has not stopped yet.
func (f *fetcher) revive() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.readerDone || f.ctx.Err() != nil {
		return false
	}
	if f.drainTimer != nil {
		if !f.drainTimer.Stop() {
			return false // the drain timed out just now
		}
		f.drainTimer = nil
	}
	f.wanted = true
	return true
}

func (f *fetcher) isWanted() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.wanted
}

// isFetching reports whether the reader still runs: wanted, or ending its
// last fetch.
func (f *fetcher) isFetching() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.readerDone
}

// finished reports whether the fetcher has exited.
func (f *fetcher) finished() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// read fetches batches while the fetcher is wanted and fewer than a batch
// wait to be handled.
func (f *fetcher) read() {
	defer f.c.fwg.Done()
	c := f.c
	const minBackoff, maxBackoff = 50 * time.Millisecond, 2 * time.Second
	backoff := minBackoff
	for {
		f.mu.Lock()
		for f.wanted && len(f.queue)-f.head >= c.o.batch {
			f.cond.Wait()
		}
		if !f.wanted {
			f.readerDone = true
			f.cond.Broadcast()
			f.mu.Unlock()
			return
		}
		cons := f.cons
		f.mu.Unlock()
		b, err := cons.Fetch(c.o.batch, jetstream.FetchMaxWait(c.o.fetchWait))
		if err == nil {
			for m := range b.Messages() {
				now := time.Now()
				f.mu.Lock()
				f.queue = append(f.queue, held{m: m, touched: now})
				f.cond.Broadcast()
				f.mu.Unlock()
			}
			err = b.Error()
		}
		if err == nil {
			backoff = minBackoff
			continue
		}
		if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
			c.log.Error("lanes: the durable consumer of a lane was deleted; creating it again (its messages still in the stream are delivered again)",
				"token", f.tok, "consumer", ConsumerName(c.group, f.tok))
			c.forget(f.tok)
			if d, err := c.durable(f.tok); err == nil {
				f.mu.Lock()
				f.cons = d
				f.mu.Unlock()
			}
		} else if f.isWanted() {
			c.log.Warn("lanes: fetch failed; retrying", "token", f.tok, "err", err)
		}
		select {
		case <-time.After(backoff):
		case <-f.wake:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// work handles the fetched messages in order, until the reader is done and
// nothing is left.
func (f *fetcher) work() {
	defer f.c.fwg.Done()
	if f.prev != nil {
		<-f.prev
	}
	for {
		f.mu.Lock()
		for f.head == len(f.queue) && !f.readerDone {
			f.cond.Wait()
		}
		if f.head == len(f.queue) {
			f.workerDone = true
			if f.drainTimer != nil {
				f.drainTimer.Stop()
			}
			f.mu.Unlock()
			break
		}
		m := f.queue[f.head].m
		f.mu.Unlock()
		if f.ctx.Err() != nil {
			// Draining timed out: give the message back, unhandled.
			m.Nak()
		} else {
			f.handle(m)
		}
		f.mu.Lock()
		f.queue[f.head] = held{}
		f.head++
		if f.head == len(f.queue) {
			f.queue, f.head = f.queue[:0], 0
		} else if f.head >= 256 && 2*f.head >= len(f.queue) {
			n := copy(f.queue, f.queue[f.head:])
			clear(f.queue[n:])
			f.queue, f.head = f.queue[:n], 0
		}
		f.cond.Broadcast()
		f.mu.Unlock()
	}
	f.cancel()
	close(f.done)
}

// extend sends InProgress for the held messages whose ack deadline is a
// third gone.
func (f *fetcher) extend(now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := f.head; i < len(f.queue); i++ {
		h := &f.queue[i]
		if now.Sub(h.touched) > f.ackWait/3 {
			h.m.InProgress()
			h.touched = now
		}
	}
}

// handle delivers one message to the handler and settles it: ack on
// success, a delayed redelivery on failure, the dead-letter topic after the
// last allowed delivery.
func (f *fetcher) handle(m jetstream.Msg) {
	c := f.c
	meta, err := m.Metadata()
	if err != nil {
		c.log.Error("lanes: a message without JetStream metadata; giving it back", "token", f.tok, "err", err)
		m.Nak()
		return
	}
	_, rest, ok := splitSubject(c.topic, m.Subject())
	if !ok {
		rest = m.Subject()
	}
	h := m.Headers()
	d := &Delivery{Lane: f.lane, Subject: rest, Data: m.Data(), Header: h, Seq: meta.Sequence.Stream,
		NumDelivered: meta.NumDelivered, Msg: m}
	if v := h[MsgIDHeader]; len(v) > 0 {
		d.MsgID = v[0]
	}
	if meta.NumDelivered > uint64(c.o.maxDeliver) {
		// Every earlier delivery ended without an ack or a failure: its
		// holder died (perhaps because of this message).
		f.deadLetter(m, d, fmt.Errorf("delivered %d times without being acknowledged", meta.NumDelivered-1))
		return
	}
	if err := f.call(d); err != nil {
		c.failed.Add(1)
		if IsPermanent(err) || meta.NumDelivered >= uint64(c.o.maxDeliver) {
			f.deadLetter(m, d, err)
			return
		}
		c.log.Debug("lanes: handler failed; the message will be delivered again", "token", f.tok, "seq", d.Seq, "deliveries", d.NumDelivered, "err", err)
		if err := m.NakWithDelay(c.delay(meta.NumDelivered)); err != nil {
			c.log.Warn("lanes: nak failed; the message comes back after AckWait", "seq", d.Seq, "err", err)
		}
		return
	}
	if c.o.syncAck {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = m.DoubleAck(ctx)
		cancel()
	} else {
		err = m.Ack()
	}
	if err != nil {
		c.log.Warn("lanes: ack failed; the message comes back after AckWait", "seq", d.Seq, "err", err)
		return
	}
	c.handled.Add(1)
}

// call runs the handler, turning a panic into an error.
func (f *fetcher) call(d *Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			f.c.log.Error("lanes: handler panicked", "token", f.tok, "seq", d.Seq, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return f.c.h.HandleMessage(f.ctx, d)
}

// deadLetter publishes the message to the dead-letter topic in its lane,
// with its headers and the reason, then terminates it. When the publish
// fails the message is delivered again later instead: it is never dropped.
func (f *fetcher) deadLetter(m jetstream.Msg, d *Delivery, cause error) {
	c := f.c
	hdr := make(nats.Header, len(d.Header)+8)
	for k, v := range d.Header {
		hdr[k] = v
	}
	seq := strconv.FormatUint(d.Seq, 10)
	hdr[HeaderDLQGroup] = []string{c.group}
	hdr[HeaderDLQService] = []string{c.service}
	hdr[HeaderDLQStream] = []string{c.stream.CachedInfo().Config.Name}
	hdr[HeaderDLQSeq] = []string{seq}
	hdr[HeaderDLQSubject] = []string{m.Subject()}
	hdr[HeaderDLQDeliveries] = []string{strconv.FormatUint(d.NumDelivered, 10)}
	msg := cause.Error()
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	hdr[HeaderDLQError] = []string{msg}
	// Publishing twice (a crash before Term) stores one dead letter.
	hdr[MsgIDHeader] = []string{"dlq:" + c.stream.CachedInfo().Config.Name + ":" + seq + ":" + c.group}
	out := &nats.Msg{Subject: c.dlq + "." + f.tok + "." + d.Subject, Header: hdr, Data: d.Data}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err := c.js.PublishMsg(ctx, out)
	cancel()
	if err != nil {
		c.log.Error("lanes: cannot publish a dead letter; the message will be delivered again", "dlq", out.Subject, "seq", d.Seq, "err", err)
		m.NakWithDelay(c.delay(uint64(len(c.o.retryDelays))))
		return
	}
	if err := m.Term(); err != nil {
		c.log.Warn("lanes: term failed after dead-lettering", "seq", d.Seq, "err", err)
	}
	c.deadLettered.Add(1)
	c.log.Warn("lanes: message dead-lettered", "token", f.tok, "seq", d.Seq, "dlq", out.Subject, "deliveries", d.NumDelivered, "err", cause)
}
