package lanesnats

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
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
// consumer and hands them to the handler, one at a time and in order.
//
// Its reader goroutine runs pull sessions: a synchronous subscription to an
// inbox, and pull requests that keep at most two batches in flight or
// waiting. Its worker goroutine takes the messages from the subscription (in
// the order JetStream sent them) and handles them. Stopping drains the
// subscription: the server sends nothing more, and the worker still takes
// and handles everything it sent before; no message is abandoned in flight.
//
// The keeper extends the ack deadline of the message in the handler and,
// when the handler is slow, moves the messages waiting behind it out of the
// subscription (into rescued) to extend theirs too.
type fetcher struct {
	c          *Consumer
	tok        string
	lane       string
	name       string // the durable's name
	ackWait    time.Duration
	ctx        context.Context // the handlers' context, in the lane
	cancel     context.CancelFunc
	prev       <-chan struct{} // the previous fetcher of the token, to wait for
	done       chan struct{}   // closed when the worker has exited
	kick       chan struct{}   // wakes the reader: room in the window, a status, a stop
	workerKick chan struct{}   // wakes the worker: a new session, or the reader's end

	pullMu sync.Mutex // held to take messages out of the subscription: worker or keeper

	mu          sync.Mutex
	sess        *session
	rescued     []held // taken out of the subscription by the keeper, in order
	cur         held   // the message in the handler, when curSet
	curSet      bool
	outstanding int       // requested and not yet taken, or expired
	lastSeen    time.Time // the last message or status taken
	status      error     // a status that ends the session
	wanted      bool
	readerDone  bool
	workerDone  bool
	drainTimer  *time.Timer
}

// A session is one subscription of a fetcher.
type session struct {
	sub      *nats.Subscription
	finished chan struct{} // closed by the worker once the subscription is closed and empty
	once     sync.Once
}

func (s *session) finish() { s.once.Do(func() { close(s.finished) }) }

type held struct {
	m       *nats.Msg
	touched time.Time // taken, or last extended
}

// Pull requests: how long one waits at the server, and how often the
// server says it is still waiting.
const (
	pullExpires   = 30 * time.Second
	pullHeartbeat = 5 * time.Second
)

var (
	errConsumerGone = errors.New("the durable consumer is gone")
	errNoHeartbeat  = errors.New("no heartbeat from the server for the pending pull request")
	errNoSession    = errors.New("no session")
)

// newFetcher starts a fetcher of tok. c.mu must be held.
func (c *Consumer) newFetcher(tok string, cons jetstream.Consumer, prev <-chan struct{}) *fetcher {
	l, _ := tokenLane(tok) // a foreign token is handled as baseline
	ackWait := c.o.ackWait
	if info := cons.CachedInfo(); info != nil && info.Config.AckWait > 0 {
		ackWait = info.Config.AckWait // the durable's own, set by whoever created it
	}
	ctx, cancel := context.WithCancel(c.laneCtx(l))
	f := &fetcher{c: c, tok: tok, lane: l, name: ConsumerName(c.group, tok), ackWait: ackWait, ctx: ctx, cancel: cancel,
		prev: prev, done: make(chan struct{}), kick: make(chan struct{}, 1), workerKick: make(chan struct{}, 1), wanted: true}
	c.fwg.Add(2)
	go f.read()
	go f.work()
	return f
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
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
	f.mu.Unlock()
	signal(f.kick)
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

// isFetching reports whether the reader still runs: wanted, or draining
// its subscription.
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

// read runs pull sessions while the fetcher is wanted, starting a new one
// after an error.
func (f *fetcher) read() {
	defer f.c.fwg.Done()
	c := f.c
	const minBackoff, maxBackoff = 50 * time.Millisecond, 2 * time.Second
	backoff := minBackoff
	for f.isWanted() {
		err := f.session()
		if err == nil || !f.isWanted() {
			continue
		}
		if errors.Is(err, errConsumerGone) {
			c.log.Error("lanes: the durable consumer of a lane is gone; creating it again (its messages still in the stream are delivered again)",
				"token", f.tok, "consumer", f.name)
			c.forget(f.tok)
			c.durable(f.tok)
		} else {
			c.log.Warn("lanes: pulling messages failed; retrying", "token", f.tok, "err", err)
		}
		select {
		case <-time.After(backoff):
		case <-f.kick:
		}
		backoff = min(2*backoff, maxBackoff)
	}
	f.mu.Lock()
	f.readerDone = true
	f.mu.Unlock()
	signal(f.workerKick)
}

// session subscribes to an inbox and sends pull requests to it, keeping two
// batches in flight or waiting, until the fetcher is stopped or the session
// fails; then it drains the subscription and waits for the worker to have
// taken everything out of it.
func (f *fetcher) session() error {
	c := f.c
	nc := c.js.Conn()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return err
	}
	s := &session{sub: sub, finished: make(chan struct{})}
	// After a reconnect, the server may have forgotten the pull requests
	// (a restarted server): ask again.
	status := nc.StatusChanged(nats.CONNECTED)
	defer nc.RemoveStatusListener(status)
	window := 2 * c.o.batch
	f.mu.Lock()
	f.sess, f.outstanding, f.status, f.lastSeen = s, 0, nil, time.Now()
	f.mu.Unlock()
	signal(f.workerKick)
	tick := time.NewTicker(pullHeartbeat)
	defer tick.Stop()
	for {
		f.mu.Lock()
		wanted, serr := f.wanted, f.status
		room := window - f.held() - f.outstanding
		quiet := f.outstanding > 0 && time.Since(f.lastSeen) > 3*pullHeartbeat
		f.mu.Unlock()
		if !wanted {
			break
		}
		if serr != nil {
			err = serr
			break
		}
		if quiet {
			if n, _, _ := sub.Pending(); n == 0 {
				err = errNoHeartbeat
				break
			}
		}
		if room >= c.o.batch {
			req := fmt.Appendf(nil, `{"batch":%d,"expires":%d,"idle_heartbeat":%d}`, room, pullExpires.Nanoseconds(), pullHeartbeat.Nanoseconds())
			if err = nc.PublishRequest(c.nextSubject(f.name), inbox, req); err != nil {
				break
			}
			f.mu.Lock()
			f.outstanding += room
			f.lastSeen = time.Now()
			f.mu.Unlock()
			continue
		}
		select {
		case <-f.kick:
		case <-tick.C:
		case <-status:
			f.mu.Lock()
			f.outstanding = 0
			f.mu.Unlock()
		}
	}
	// The server sends nothing after the unsubscribe; what it sent before
	// stays in the subscription until the worker has taken it.
	if sub.Drain() != nil {
		sub.Unsubscribe()
	}
	select {
	case <-s.finished:
	case <-time.After(c.o.drain + 5*time.Second):
		sub.Unsubscribe() // the worker is stuck; what is left comes back after AckWait
		<-s.finished
	}
	return err
}

// held counts the messages taken and not finished. f.mu must be held.
func (f *fetcher) held() int {
	n := len(f.rescued)
	if f.curSet {
		n++
	}
	return n
}

// take returns the next message to handle: a rescued one, else the next
// one of the session's subscription (waiting for it). It returns
// errNoSession when there is no session, and the subscription's error once
// it is closed and empty. f.pullMu must be held.
func (f *fetcher) take() (*nats.Msg, *session, error) {
	f.mu.Lock()
	if len(f.rescued) > 0 {
		h := f.rescued[0]
		f.rescued[0] = held{}
		f.rescued = f.rescued[1:]
		f.cur, f.curSet = h, true
		f.mu.Unlock()
		return h.m, nil, nil
	}
	s := f.sess
	f.mu.Unlock()
	if s == nil {
		return nil, nil, errNoSession
	}
	m, err := s.sub.NextMsg(time.Minute)
	if err != nil {
		return nil, s, err
	}
	now := time.Now()
	f.mu.Lock()
	f.lastSeen = now
	if !isStatus(m) {
		if f.outstanding > 0 {
			f.outstanding--
		}
		f.cur, f.curSet = held{m: m, touched: now}, true
	}
	f.mu.Unlock()
	return m, s, nil
}

func isStatus(m *nats.Msg) bool {
	return len(m.Data) == 0 && len(m.Header) > 0 && m.Header.Get("Status") != ""
}

// work handles the messages in order, until the reader is done and nothing
// is left.
func (f *fetcher) work() {
	defer f.c.fwg.Done()
	if f.prev != nil {
		<-f.prev
	}
	for {
		f.pullMu.Lock()
		m, s, err := f.take()
		f.pullMu.Unlock()
		switch {
		case errors.Is(err, errNoSession):
			f.mu.Lock()
			end := f.readerDone && f.sess == nil && len(f.rescued) == 0
			if end {
				f.workerDone = true
				if f.drainTimer != nil {
					f.drainTimer.Stop()
				}
			}
			f.mu.Unlock()
			if end {
				f.cancel()
				close(f.done)
				return
			}
			<-f.workerKick
			continue
		case errors.Is(err, nats.ErrTimeout):
			continue
		case err != nil:
			// The session's subscription is closed and empty.
			f.mu.Lock()
			if f.sess == s {
				f.sess = nil
			}
			f.mu.Unlock()
			s.finish()
			continue
		}
		if isStatus(m) {
			f.onStatus(m)
			signal(f.kick)
			continue
		}
		if f.ctx.Err() != nil {
			// Draining timed out: give the message back, unhandled.
			m.Nak()
		} else {
			f.handle(m)
		}
		f.mu.Lock()
		f.cur, f.curSet = held{}, false
		// Wake the reader only when a pull request is due.
		due := 2*f.c.o.batch-f.held()-f.outstanding >= f.c.o.batch
		f.mu.Unlock()
		if due {
			signal(f.kick)
		}
	}
}

// onStatus accounts for a status message of a pull request.
func (f *fetcher) onStatus(m *nats.Msg) {
	f.mu.Lock()
	defer f.mu.Unlock()
	code, desc := m.Header.Get("Status"), m.Header.Get("Description")
	switch code {
	case "100": // idle heartbeat
		return
	case "404", "408", "409":
		if code == "409" && strings.Contains(strings.ToLower(desc), "consumer deleted") {
			f.status = errConsumerGone
			return
		}
		// The request ended; the header says how many it had left.
		if n, err := strconv.Atoi(m.Header.Get("Nats-Pending-Messages")); err == nil {
			f.outstanding = max(0, f.outstanding-n)
		} else {
			f.outstanding = 0
		}
	case "503": // no responders: the durable does not exist
		f.status = errConsumerGone
	default:
		f.status = fmt.Errorf("pull request refused: %s %s", code, desc)
	}
}

// nextSubject is the subject of pull requests to the durable name.
func (c *Consumer) nextSubject(name string) string {
	return c.apiPrefix + "CONSUMER.MSG.NEXT." + c.stream.CachedInfo().Config.Name + "." + name
}

// extend sends InProgress for the messages held past a third of their
// AckWait: the one in the handler and the rescued ones. When the handler
// has been busy that long, it first rescues the messages waiting in the
// subscription behind it.
func (f *fetcher) extend(now time.Time) {
	f.mu.Lock()
	slow := f.curSet && now.Sub(f.cur.touched) > f.ackWait/3
	s := f.sess
	f.mu.Unlock()
	if slow && s != nil && f.pullMu.TryLock() {
		for {
			m, err := s.sub.NextMsg(time.Nanosecond)
			if err != nil {
				break
			}
			if isStatus(m) {
				f.onStatus(m)
				continue
			}
			f.mu.Lock()
			if f.outstanding > 0 {
				f.outstanding--
			}
			f.rescued = append(f.rescued, held{m: m, touched: time.Time{}})
			f.mu.Unlock()
		}
		f.pullMu.Unlock()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.curSet && now.Sub(f.cur.touched) > f.ackWait/3 {
		f.cur.m.InProgress()
		f.cur.touched = now
	}
	for i := range f.rescued {
		h := &f.rescued[i]
		if now.Sub(h.touched) > f.ackWait/3 {
			h.m.InProgress()
			h.touched = now
		}
	}
}

// handle delivers one message to the handler and settles it: ack on
// success, a delayed redelivery on failure, the dead-letter topic after the
// last allowed delivery.
func (f *fetcher) handle(m *nats.Msg) {
	c := f.c
	seq, delivered, ok := ackInfo(m.Reply)
	if !ok {
		c.log.Error("lanes: a message without JetStream metadata; giving it back", "token", f.tok, "reply", m.Reply)
		m.Nak()
		return
	}
	_, rest, ok := splitSubject(c.topic, m.Subject)
	if !ok {
		rest = m.Subject
	}
	h := m.Header
	d := &Delivery{Lane: f.lane, Subject: rest, Data: m.Data, Header: h, Seq: seq, NumDelivered: delivered, Msg: m}
	if v := h[MsgIDHeader]; len(v) > 0 {
		d.MsgID = v[0]
	}
	if delivered > uint64(c.o.maxDeliver) {
		// Every earlier delivery ended without an ack or a failure: its
		// holder died (perhaps because of this message).
		f.deadLetter(m, d, fmt.Errorf("delivered %d times without being acknowledged", delivered-1))
		return
	}
	if err := f.call(d); err != nil {
		c.failed.Add(1)
		if IsPermanent(err) || delivered >= uint64(c.o.maxDeliver) {
			f.deadLetter(m, d, err)
			return
		}
		c.log.Debug("lanes: handler failed; the message will be delivered again", "token", f.tok, "seq", d.Seq, "deliveries", d.NumDelivered, "err", err)
		if err := m.NakWithDelay(c.delay(delivered)); err != nil {
			c.log.Warn("lanes: nak failed; the message comes back after AckWait", "seq", d.Seq, "err", err)
		}
		return
	}
	var err error
	if c.o.syncAck {
		err = m.AckSync()
	} else {
		err = m.Ack()
	}
	if err != nil {
		c.log.Warn("lanes: ack failed; the message comes back after AckWait", "seq", d.Seq, "err", err)
		return
	}
	c.handled.Add(1)
}

// ackInfo reads the stream sequence and the delivery count of a message
// from its ack subject, without allocating:
// $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>,
// or, from newer servers, with a domain and an account hash after ACK and a
// random token at the end.
func ackInfo(reply string) (seq, delivered uint64, ok bool) {
	if !strings.HasPrefix(reply, "$JS.ACK.") {
		return 0, 0, false
	}
	var tokens [12]string
	n, start := 0, 0
	for i := 0; i <= len(reply); i++ {
		if i == len(reply) || reply[i] == '.' {
			if n == len(tokens) {
				return 0, 0, false
			}
			tokens[n] = reply[start:i]
			n++
			start = i + 1
		}
	}
	var d, sq string
	switch {
	case n == 9:
		d, sq = tokens[4], tokens[5]
	case n >= 11:
		d, sq = tokens[6], tokens[7]
	default:
		return 0, 0, false
	}
	delivered, err1 := strconv.ParseUint(d, 10, 64)
	seq, err2 := strconv.ParseUint(sq, 10, 64)
	return seq, delivered, err1 == nil && err2 == nil
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
func (f *fetcher) deadLetter(m *nats.Msg, d *Delivery, cause error) {
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
	hdr[HeaderDLQSubject] = []string{m.Subject}
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
