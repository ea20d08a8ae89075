package lanesnats

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/internal/lib/mqlane"
	"github.com/nats-io/nats.go/jetstream"
)

// pullExpires is how long a pull request waits at the server.
const pullExpires = 30 * time.Second

// pullHeartbeat is how often the server says that a pull request is still
// waiting: AckWait/4 within 500ms (jetstream's least) and 5s. A pull request lost with a server (a crash,
// a new leader of the durable, which does not know the old one's requests)
// is noticed after two missing heartbeats and made again; the bound keeps
// that within the hand-off window.
func pullHeartbeat(ackWait time.Duration) time.Duration {
	return min(5*time.Second, max(500*time.Millisecond, ackWait/4))
}

// A fetcher handles the messages of one lane token: it iterates over its
// durable consumer with jetstream's Messages, which keeps two batches in
// flight or buffered (pull requests, heartbeats, statuses and reconnects are
// the library's), and hands the messages to the handler one at a time, in
// order, on its loop goroutine. Stopping drains the iterator: the server
// sends nothing more, and what it sent before is still taken out and
// handled.
//
// A timer (keep) pushes back the ack deadline of the message in the handler
// when the handler is slow, and of the messages behind it: it drains the
// iterator and takes what it buffered out (rescued), since buffered messages
// cannot be kept alive. take and the rescue hold takeMu, so that the loop
// handles the rescued messages first, in order.
type fetcher struct {
	c       *Consumer
	tok     string
	lane    string
	cons    jetstream.Consumer // the loop's
	ackWait time.Duration
	ctx     context.Context // the handlers' context, in the lane
	cancel  context.CancelFunc
	prev    *fetcher      // the previous fetcher of the token, to wait for (the loop's; nil once it has)
	done    chan struct{} // closed when the loop has exited

	takeMu sync.Mutex // held to take messages out of the iterator: the loop or the keeper

	mu       sync.Mutex
	wanted   bool
	fetching bool                      // wanted, or draining its iterator
	iter     jetstream.MessagesContext // nil between iterators
	drain    *time.Timer               // the drain timeout, while stopping
	keeper   *time.Timer
	exited   bool
	cur      heldMsg // the message in the handler, when curSet
	curSet   bool
	rescued  []heldMsg // taken out of the iterator behind a slow handler, in order

	acked recentAcks // the loop's: what it and the fetchers of the token before it acknowledged lately
}

// heldMsg is a message the fetcher holds, with when its ack deadline was
// last pushed back.
type heldMsg struct {
	m       jetstream.Msg
	touched time.Time
}

// newFetcher starts a fetcher of tok, after prev (the token's previous
// fetcher, or nil) has exited. c.mu must be held.
func (c *Consumer) newFetcher(tok string, cons jetstream.Consumer, prev *fetcher) *fetcher {
	l, _ := tokenLane(tok) // a foreign token is handled as baseline
	ackWait := c.o.ackWait
	if info := cons.CachedInfo(); info != nil && info.Config.AckWait > 0 {
		ackWait = info.Config.AckWait // the durable's own, set by whoever created it
	}
	ctx, cancel := context.WithCancel(c.laneCtx(l))
	f := &fetcher{c: c, tok: tok, lane: l, cons: cons, ackWait: ackWait, ctx: ctx, cancel: cancel,
		prev: prev, done: make(chan struct{}), wanted: true, fetching: true}
	go f.loop() // owned by c: shutdown waits for done
	return f
}

// stop makes the fetcher stop fetching and exit once it has handled what it
// holds (within the drain timeout). It reports whether it was wanted.
func (f *fetcher) stop() bool {
	f.mu.Lock()
	was, it := f.wanted, f.iter
	f.wanted = false
	if f.drain == nil && !f.exited {
		f.drain = time.AfterFunc(f.c.o.drain, f.cancel)
	}
	f.mu.Unlock()
	if it != nil {
		it.Drain()
	}
	return was
}

// revive makes a stopping fetcher fetch again, if it has not exited yet nor
// timed out draining.
func (f *fetcher) revive() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.exited || f.ctx.Err() != nil {
		return false
	}
	if f.drain != nil {
		if !f.drain.Stop() {
			return false // the drain timed out just now
		}
		f.drain = nil
	}
	f.wanted, f.fetching = true, true
	return true
}

// isFetching reports whether the fetcher still pulls: wanted, or draining
// its iterator.
func (f *fetcher) isFetching() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fetching
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

// loop opens iterators while the fetcher is wanted, handles what they
// deliver, and exits once it is stopped and holds nothing.
func (f *fetcher) loop() {
	defer close(f.done)
	defer f.cancel()
	f.follow()
	f.mu.Lock()
	f.keeper = time.AfterFunc(f.ackWait/6, f.keep)
	f.mu.Unlock()
	const minBackoff, maxBackoff = 50 * time.Millisecond, 2 * time.Second
	backoff := minBackoff
	for {
		f.handleRescued()
		it, ok := f.open()
		if !ok {
			f.takeMu.Lock() // no rescue in flight
			f.mu.Lock()
			f.exited = true
			f.keeper.Stop()
			if f.drain != nil {
				f.drain.Stop()
			}
			f.mu.Unlock()
			f.takeMu.Unlock()
			return
		}
		if it == nil {
			f.sleep(&backoff, maxBackoff)
			continue
		}
		if err := f.consume(it); err != nil {
			f.onError(err)
			f.sleep(&backoff, maxBackoff)
			continue
		}
		backoff = minBackoff
	}
}

// follow waits until the token's previous fetcher, if any, has exited (order
// within the lane: it finishes its messages first), and takes over what it
// acknowledged lately: a copy of a message it acknowledged late can come to
// this fetcher when the lane came back to this consumer within AckWait.
func (f *fetcher) follow() {
	if p := f.prev; p != nil {
		<-p.done
		f.acked = p.acked
		f.prev = nil
	}
}

// open returns a new iterator over the durable, or ok false when the
// fetcher is no longer wanted. A nil iterator with ok means it failed and
// must be tried again.
func (f *fetcher) open() (_ jetstream.MessagesContext, ok bool) {
	f.mu.Lock()
	wanted := f.wanted
	f.fetching = wanted
	f.mu.Unlock()
	if !wanted {
		return nil, false
	}
	it, err := f.cons.Messages(
		jetstream.PullMaxMessages(2*f.c.o.batch),
		jetstream.PullThresholdMessages(f.c.o.batch),
		jetstream.PullExpiry(pullExpires),
		jetstream.PullHeartbeat(pullHeartbeat(f.ackWait)),
		jetstream.WithMessagesErrOnMissingHeartbeat(true),
	)
	if err != nil {
		f.c.log.Warn("lanes: cannot pull the messages of a lane; retrying", "token", f.tok, "err", err)
		return nil, true
	}
	f.mu.Lock()
	f.iter = it
	wanted = f.wanted
	f.mu.Unlock()
	if !wanted {
		it.Drain() // stopped while opening
	}
	return it, true
}

// consume handles the messages of it until it is closed (drained), and
// returns the error that ended it otherwise.
func (f *fetcher) consume(it jetstream.MessagesContext) error {
	defer func() {
		f.mu.Lock()
		f.iter = nil
		f.mu.Unlock()
	}()
	for {
		m, err := f.take(it)
		switch {
		case errors.Is(err, jetstream.ErrMsgIteratorClosed):
			return nil // drained: by a stop, or behind a slow handler
		case errors.Is(err, jetstream.ErrNoHeartbeat):
			// The library pulls again; check that the durable is still
			// there, as a deleted one does not always say so.
			if f.durableGone() {
				it.Stop()
				return jetstream.ErrConsumerDeleted
			}
			continue
		case err != nil:
			it.Stop()
			return err
		}
		f.handle(m)
	}
}

// take returns the next message to handle: a rescued one, else the next one
// of it (nil: rescued ones only), waiting for it.
func (f *fetcher) take(it jetstream.MessagesContext) (jetstream.Msg, error) {
	f.takeMu.Lock()
	defer f.takeMu.Unlock()
	f.mu.Lock()
	if len(f.rescued) > 0 {
		h := f.rescued[0]
		f.rescued[0] = heldMsg{}
		f.rescued = f.rescued[1:]
		f.cur, f.curSet = h, true
		f.mu.Unlock()
		return h.m, nil
	}
	f.mu.Unlock()
	if it == nil {
		return nil, jetstream.ErrMsgIteratorClosed
	}
	m, err := it.Next()
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.cur, f.curSet = heldMsg{m: m, touched: time.Now()}, true
	f.mu.Unlock()
	return m, nil
}

// handleRescued handles what is left of the messages rescued from behind a
// slow handler, in order.
func (f *fetcher) handleRescued() {
	for {
		m, err := f.take(nil)
		if err != nil {
			return
		}
		f.handle(m)
	}
}

// durableGone reports whether the lane's durable consumer no longer exists.
func (f *fetcher) durableGone() bool {
	ctx, cancel := context.WithTimeout(f.ctx, apiTimeout)
	defer cancel()
	_, err := f.cons.Info(ctx)
	return errors.Is(err, jetstream.ErrConsumerNotFound)
}

// onError logs why an iterator ended; a deleted durable is created again.
func (f *fetcher) onError(err error) {
	c := f.c
	if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
		c.log.Error("lanes: the durable consumer of a lane is gone; creating it again (its messages still in the stream are delivered again)",
			"token", f.tok, "consumer", consumerName(c.group, f.tok))
		c.forget(f.tok)
		if cons, err := c.durable(f.tok); err == nil {
			f.cons = cons
		}
		// A new durable delivers again on purpose, from its own cursor:
		// what the old one had acknowledged is handled again, not taken
		// for the copies of late acks (which the memory is for).
		f.acked = recentAcks{}
		return
	}
	c.log.Warn("lanes: pulling messages failed; retrying", "token", f.tok, "err", err)
}

// sleep waits for the backoff, or less when the fetcher is stopped.
func (f *fetcher) sleep(backoff *time.Duration, limit time.Duration) {
	t := time.NewTimer(*backoff)
	defer t.Stop()
	select {
	case <-t.C:
	case <-f.ctx.Done():
	}
	*backoff = min(2**backoff, limit)
}

// handle handles the message taken (f.cur) and settles it.
func (f *fetcher) handle(m jetstream.Msg) {
	defer func() {
		f.mu.Lock()
		f.cur, f.curSet = heldMsg{}, false
		f.mu.Unlock()
	}()
	if f.ctx.Err() != nil {
		m.Nak() // draining timed out: give it back, unhandled
		return
	}
	d, ok := f.delivery(m)
	if !ok {
		return
	}
	if f.acked.has(d) {
		// Handled and acknowledged already, by this fetcher: the ack
		// reached JetStream after AckWait. Acknowledge the copy too.
		f.c.log.Debug("lanes: a message handled already was delivered again; acknowledging it", "token", f.tok, "seq", d.Seq, "deliveries", d.NumDelivered)
		if err := m.Ack(); err != nil {
			f.c.log.Warn("lanes: ack failed; the message comes back after AckWait", "seq", d.Seq, "err", err)
		}
		f.c.ackedAgain.Add(1)
		return
	}
	if d.NumDelivered > uint64(f.c.o.maxDeliver) {
		// Every earlier delivery ended without an ack or a failure: its
		// holder died (perhaps because of this message).
		f.deadLetter(d, fmt.Errorf("delivered %d times without being acknowledged", d.NumDelivered-1))
		return
	}
	ctx := f.ctx
	if tr := f.c.tracer; tr != nil {
		var span trace.Span
		ctx, span = f.startSpan(tr, d)
		defer span.End()
		err := f.call(ctx, d)
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		f.settle(d, err)
		return
	}
	f.settle(d, f.call(ctx, d))
}

// startSpan starts the consumer span of d, in the trace of its producer: the message's lane, the
// lane of this consumer, which serves it, why they differ, and the delivery count.
func (f *fetcher) startSpan(tr trace.Tracer, d *Delivery) (context.Context, trace.Span) {
	c := f.c
	ctx := traceContext.Extract(f.ctx, propagation.HeaderCarrier(d.Header))
	return mqlane.StartConsumerSpan(ctx, tr, c.engine, c.inst, c.topic, "nats", d.Subject, d.Lane, int64(d.NumDelivered))
}

// keep runs every AckWait/6 while the fetcher runs. It pushes back the ack
// deadline of the messages held longer than a third of their AckWait: the
// one in the handler and those rescued behind it. When the handler is that
// slow, it first drains the iterator and takes what it buffered out; the
// loop opens a new iterator once the rescued messages are handled.
func (f *fetcher) keep() {
	now := time.Now()
	f.mu.Lock()
	slow := f.curSet && now.Sub(f.cur.touched) > f.ackWait/3
	it, exited := f.iter, f.exited
	f.mu.Unlock()
	if exited {
		return
	}
	if slow && it != nil && f.takeMu.TryLock() {
		// The loop is in the handler: nobody else takes from it.
		it.Drain()
		for {
			m, err := it.Next(jetstream.NextMaxWait(time.Second))
			if err != nil {
				break // closed, or the rest comes at the next tick
			}
			f.mu.Lock()
			f.rescued = append(f.rescued, heldMsg{m: m})
			f.mu.Unlock()
		}
		f.takeMu.Unlock()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.curSet && now.Sub(f.cur.touched) > f.ackWait/3 {
		f.cur.m.InProgress()
		f.cur.touched = now
	}
	for i := range f.rescued {
		if r := &f.rescued[i]; now.Sub(r.touched) > f.ackWait/3 {
			r.m.InProgress()
			r.touched = now
		}
	}
	if !f.exited {
		f.keeper.Reset(f.ackWait / 6)
	}
}

// delivery is what the handler sees of m.
func (f *fetcher) delivery(m jetstream.Msg) (*Delivery, bool) {
	c := f.c
	meta, err := m.Metadata()
	if err != nil {
		c.log.Error("lanes: a message without JetStream metadata; giving it back", "token", f.tok, "reply", m.Reply(), "err", err)
		m.Nak()
		return nil, false
	}
	_, rest, ok := splitSubject(c.topic, m.Subject())
	if !ok {
		rest = m.Subject()
	}
	h := m.Headers()
	d := &Delivery{Lane: f.lane, Subject: rest, Data: m.Data(), Header: h, Seq: meta.Sequence.Stream, NumDelivered: meta.NumDelivered, Msg: m}
	if v := h[MsgIDHeader]; len(v) > 0 {
		d.MsgID = v[0]
	}
	return d, true
}

// call runs the handler, turning a panic into an error.
func (f *fetcher) call(ctx context.Context, d *Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			f.c.log.Error("lanes: handler panicked", "token", f.tok, "seq", d.Seq, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return f.c.h.HandleMessage(ctx, d)
}

// settle acknowledges a handled message; a failed one is delivered again
// after a delay, or goes to the dead-letter topic after the last allowed
// delivery.
func (f *fetcher) settle(d *Delivery, err error) {
	c, m := f.c, d.Msg
	if err != nil {
		c.failed.Add(1)
		if IsPermanent(err) || d.NumDelivered >= uint64(c.o.maxDeliver) {
			f.deadLetter(d, err)
			return
		}
		c.log.Debug("lanes: handler failed; the message will be delivered again", "token", f.tok, "seq", d.Seq, "deliveries", d.NumDelivered, "err", err)
		if err := m.NakWithDelay(c.delay(d.NumDelivered)); err != nil {
			c.log.Warn("lanes: nak failed; the message comes back after AckWait", "seq", d.Seq, "err", err)
		}
		return
	}
	if c.o.syncAck {
		err = m.DoubleAck(context.Background())
	} else {
		err = m.Ack()
	}
	if err != nil {
		c.log.Warn("lanes: ack failed; the message comes back after AckWait", "seq", d.Seq, "err", err)
		return
	}
	f.acked.add(d, 4*c.o.batch)
	c.handled.Add(1)
}
