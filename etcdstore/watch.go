package etcdstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/lanesdev/lanes/internal/lib/backoff"
	"github.com/lanesdev/lanes/registry"
)

// Watch implements registry.Registry. It lists the instances of service (of
// every service when service is empty) with ctx, so that an unreachable etcd
// is reported here, and returns a Watcher whose first batch is that list as
// a reset.
//
// The Watcher's goroutine then watches from the revision after the list.
// Each etcd watch response becomes one Batch. When the watch breaks (etcd
// restarted, or the member lost its leader: the watch requires one, so that
// it cannot hang on a partitioned member) or stops answering progress
// requests, it resumes from the last revision delivered, with backoff, and
// no change is lost. When etcd has compacted that revision away, it lists
// again and sends a reset batch.
//
// A key whose value is not a valid instance (not JSON, not passing
// registry.Normalize, or not matching its key) is logged and treated as
// absent: it is left out of lists, a put of such a value over a valid
// instance is delivered as the delete of that instance, and its own delete
// is not delivered. The Watcher knows which keys hold such values from its
// list and the events since, so that etcd need not send the previous value
// of every change (which costs etcd a read per change and per watcher).
func (s *Store) Watch(ctx context.Context, service string) (registry.Watcher, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	prefix := s.InstancesPrefix()
	if service != "" {
		if err := registry.CheckService(service); err != nil {
			return nil, err
		}
		prefix += service + "/"
	}
	if s.g.Closed() {
		return nil, registry.ErrClosed
	}
	invalid := map[string]struct{}{}
	first, err := s.list(ctx, prefix, invalid)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: watch: %w", err)
	}
	return s.startWatcher(prefix, &first, first.Revision, invalid)
}

// startWatcher starts a watcher of prefix whose first batch is first (if
// not nil) and that watches from revision rev (exclusive). invalid holds
// the keys under prefix whose values were not valid instances at rev.
func (s *Store) startWatcher(prefix string, first *registry.Batch, rev int64, invalid map[string]struct{}) (*watcher, error) {
	w := &watcher{s: s, prefix: prefix, out: make(chan registry.Batch, 1), invalid: invalid}
	w.start(s)
	if first != nil {
		w.out <- *first
	}
	if !s.g.Go(func() { w.run(rev) }) {
		w.cancel()
		return nil, registry.ErrClosed
	}
	return w, nil
}

// list returns the instances under prefix as a reset batch, and makes
// invalid the set of the keys whose values are not valid instances.
func (s *Store) list(ctx context.Context, prefix string, invalid map[string]struct{}) (registry.Batch, error) {
	resp, err := s.client.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return registry.Batch{}, err
	}
	clear(invalid)
	b := registry.Batch{Reset: true, Revision: resp.Header.Revision, Events: make([]registry.Event, 0, len(resp.Kvs))}
	for _, kv := range resp.Kvs {
		inst, err := s.decode(kv)
		if err != nil {
			s.log.Error("skipping an invalid instance in etcd", "key", string(kv.Key), "revision", kv.ModRevision, "err", err)
			invalid[string(kv.Key)] = struct{}{}
			continue
		}
		b.Events = append(b.Events, registry.Event{Type: registry.EventPut, Instance: inst, Revision: kv.ModRevision})
	}
	return b, nil
}

// splitKey returns the service and ID of an instance key.
func (s *Store) splitKey(key []byte) (service, id string, ok bool) {
	svc, idb, ok := s.splitKeyBytes(key)
	if !ok {
		return "", "", false
	}
	return string(svc), string(idb), true
}

// splitKeyBytes is splitKey without copying: the service and ID are parts of
// key.
func (s *Store) splitKeyBytes(key []byte) (service, id []byte, ok bool) {
	rest, ok := bytes.CutPrefix(key, s.instances)
	if !ok {
		return nil, nil, false
	}
	service, id, ok = bytes.Cut(rest, []byte("/"))
	if !ok || len(service) == 0 || len(id) == 0 || bytes.IndexByte(id, '/') >= 0 {
		return nil, nil, false
	}
	return service, id, true
}

// errInstanceKey is the error of a value under a key that is not an
// instance key.
var errInstanceKey = errors.New("key is not <prefix>instances/<service>/<id>")

// decode returns the instance stored in kv, validated.
func (s *Store) decode(kv *mvccpb.KeyValue) (registry.Instance, error) {
	service, id, ok := s.splitKeyBytes(kv.Key)
	if !ok {
		return registry.Instance{}, errInstanceKey
	}
	var in registry.Instance
	if err := unmarshalInstance(kv.Value, &in); err != nil {
		return registry.Instance{}, fmt.Errorf("value is not an instance in JSON: %w", err)
	}
	in, err := registry.Normalize(in)
	if err != nil {
		return registry.Instance{}, err
	}
	if in.Service != string(service) || in.ID != string(id) {
		return registry.Instance{}, fmt.Errorf("value is instance %s/%s, not the one its key names", in.Service, in.ID)
	}
	return in, nil
}

// event turns an etcd event into a registry event; ok is false when there
// is nothing to deliver. It keeps w.invalid, the keys that hold invalid
// values, up to date.
func (w *watcher) event(ev *mvccpb.Event) (e registry.Event, ok bool) {
	kv := ev.Kv
	e.Revision = kv.ModRevision
	service, id, keyOK := w.s.splitKeyBytes(kv.Key)
	if !keyOK {
		w.s.log.Warn("skipping a key that is not an instance", "key", string(kv.Key), "revision", kv.ModRevision)
		return e, false
	}
	_, wasInvalid := w.invalid[string(kv.Key)]
	if ev.Type == mvccpb.DELETE {
		if wasInvalid {
			delete(w.invalid, string(kv.Key))
			return e, false // an invalid value was never delivered
		}
		e.Type = registry.EventDelete
		e.Instance = registry.Instance{Service: string(service), ID: string(id)}
		return e, true
	}
	inst, err := w.s.decode(kv)
	if err != nil {
		w.s.log.Error("skipping an invalid instance in etcd", "key", string(kv.Key), "revision", kv.ModRevision, "err", err)
		w.invalid[string(kv.Key)] = struct{}{}
		if !wasInvalid && kv.Version > 1 {
			// The valid instance that was there is gone.
			e.Type = registry.EventDelete
			e.Instance = registry.Instance{Service: string(service), ID: string(id)}
			return e, true
		}
		return e, false
	}
	if wasInvalid {
		delete(w.invalid, string(kv.Key))
	}
	e.Type = registry.EventPut
	e.Instance = inst
	return e, true
}

// watchLife is what every watcher of the Store has: a context that Close
// and Store.Close cancel, the goroutine (run) that Close waits for, and
// whether Close was called.
type watchLife struct {
	ctx    context.Context // cancelled by Close and by Store.Close
	cancel context.CancelFunc
	done   chan struct{} // closed when the watcher's goroutine returns

	closeOnce sync.Once
	mu        sync.Mutex // guards closed, and what the watcher adds
	closed    bool
}

func (l *watchLife) start(s *Store) {
	l.ctx, l.cancel = context.WithCancel(s.g.Context())
	l.done = make(chan struct{})
}

func (l *watchLife) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// Close implements registry.Watcher and policy.Watcher: it cancels the
// watch and waits for its goroutine.
func (l *watchLife) Close() error {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		l.cancel()
		<-l.done
	})
	return nil
}

// watcher is a registry.Watcher on etcd, and a registry.Pusher.
type watcher struct {
	watchLife
	s       *Store
	prefix  string
	out     chan registry.Batch // run sends here; capacity 1 for the first list
	invalid map[string]struct{} // the keys whose values are not valid instances; run's

	// push is the function of Push, nil before. Every call of it, and
	// every read of out once it is set, is made under pushMu, so that the
	// batches that went to out before Push reach push first, in order.
	pushMu sync.Mutex
	push   func(registry.Batch)
}

// Push implements registry.Pusher. The batches that wait in out (the first
// list, and one that run was sending) are handed to fn at once, here or by
// run; every later one by run.
func (w *watcher) Push(fn func(registry.Batch)) <-chan struct{} {
	w.pushMu.Lock()
	defer w.pushMu.Unlock()
	w.push = fn
	w.drain()
	return w.done
}

// drain hands the batches waiting in out to push. w.pushMu must be held,
// and push set.
func (w *watcher) drain() {
	for {
		select {
		case b := <-w.out:
			w.push(b)
		default:
			return
		}
	}
}

// Next implements registry.Watcher.
func (w *watcher) Next(ctx context.Context) (registry.Batch, error) {
	if w.isClosed() {
		return registry.Batch{}, registry.ErrClosed
	}
	select {
	case b := <-w.out:
		return b, nil
	case <-w.done:
		return registry.Batch{}, registry.ErrClosed
	case <-ctx.Done():
		return registry.Batch{}, ctx.Err()
	}
}

// send hands b to push, or else to Next; it returns false when the
// watcher is closing.
func (w *watcher) send(b registry.Batch) bool {
	if w.pushed(&b) {
		return w.ctx.Err() == nil
	}
	select {
	case w.out <- b:
	case <-w.ctx.Done():
		return false
	}
	// Push may have come while b waited: b must not wait for the next
	// batch.
	w.pushed(nil)
	return true
}

// pushed hands the batches in out, then *b (when b is not nil), to push,
// and reports whether it could: whether Push was called.
func (w *watcher) pushed(b *registry.Batch) bool {
	w.pushMu.Lock()
	defer w.pushMu.Unlock()
	if w.push == nil {
		return false
	}
	w.drain()
	if b != nil {
		w.push(*b)
	}
	return true
}

// run follows the keys from revision rev (exclusive) until the watcher is
// closed. It is the watcher's goroutine.
func (w *watcher) run(rev int64) {
	defer close(w.done)
	relist := func(ctx context.Context) (int64, error) {
		b, err := w.s.list(ctx, w.prefix, w.invalid)
		if err != nil {
			return 0, err
		}
		if !w.send(b) {
			return 0, ctx.Err()
		}
		return b.Revision, nil
	}
	w.s.follow(w.ctx, w.prefix, true, rev, false, relist, func(evs []*mvccpb.Event) bool {
		b := registry.Batch{Revision: evs[len(evs)-1].Kv.ModRevision, Events: make([]registry.Event, 0, len(evs))}
		for _, ev := range evs {
			if e, ok := w.event(ev); ok {
				b.Events = append(b.Events, e)
			}
		}
		return len(b.Events) == 0 || w.send(b)
	})
}

// follow is the loop of every watch of the Store. It follows key (a prefix
// when prefix is set) from revision rev (exclusive), calling deliver with
// the events of every watch response, in order. A watch that breaks resumes
// from the last revision delivered, with backoff (100ms to 2s); when etcd
// has compacted that revision away, or at once when list is set, relist
// reads the keys again (and delivers them as it must) and returns the
// revision of its read. follow returns when ctx is done, deliver returns
// false, or the etcd client is closed.
func (s *Store) follow(ctx context.Context, key string, prefix bool, rev int64, list bool, relist func(context.Context) (int64, error), deliver func([]*mvccpb.Event) bool) {
	bo := backoff.New(100*time.Millisecond, 2*time.Second)
	for ctx.Err() == nil {
		if list {
			r, err := relist(ctx)
			if err != nil {
				if ctx.Err() != nil || s.client.Ctx().Err() != nil {
					return
				}
				s.log.Warn("watch: listing failed; retrying", "key", key, "err", err)
				if !bo.Wait(ctx) {
					return
				}
				continue
			}
			rev, list = r, false
		}
		progressed, err := followKeys(ctx, s.client, key, prefix, &rev, deliver)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, rpctypes.ErrCompacted):
			s.log.Info("watch: revision compacted; listing again", "key", key, "revision", rev+1)
			list = true
			continue
		case s.client.Ctx().Err() != nil:
			s.log.Error("watch: the etcd client was closed; ending the watch", "key", key)
			return
		}
		s.log.Warn("watch interrupted; resuming", "key", key, "revision", rev+1, "err", err)
		if progressed {
			bo.Reset()
		}
		if !bo.Wait(ctx) {
			return
		}
	}
}

// Follow follows the keys under prefix, for callers that keep a table of
// their own under the Store's prefix (such as the admin API's client-IP
// claims): it calls list with the keys and the revision of a read, then
// events with the events of every later change, in order, as the Store's
// own watches do (resuming broken watches, listing again after a
// compaction). It blocks until ctx is done or the Store is closed, and
// returns ctx's error or registry.ErrClosed.
func (s *Store) Follow(ctx context.Context, prefix string, list func(kvs []*mvccpb.KeyValue, rev int64), events func([]*clientv3.Event)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.g.Context(), cancel)
	defer stop()
	relist := func(ctx context.Context) (int64, error) {
		resp, err := s.client.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			return 0, err
		}
		list(resp.Kvs, resp.Header.Revision)
		return resp.Header.Revision, nil
	}
	s.follow(ctx, prefix, true, 0, true, relist, func(evs []*mvccpb.Event) bool {
		out := make([]*clientv3.Event, len(evs))
		for i, ev := range evs {
			out[i] = (*clientv3.Event)(ev)
		}
		events(out)
		return true
	})
	if s.g.Closed() {
		return registry.ErrClosed
	}
	return ctx.Err()
}

// Watch liveness. A watch that has received nothing for progressAfter asks
// etcd for a progress notification (one small message on its stream; etcd
// answers it without reading its store); if none arrives within
// progressTimeout, the watch is taken for stuck and is started again from
// the last revision it delivered.
var (
	progressAfter   = 10 * time.Second
	progressTimeout = 5 * time.Second
)

// errUnresponsive ends a watch that did not answer a progress request.
var errUnresponsive = errors.New("no answer to a progress request")

// followKeys watches key (a prefix when prefix is set) after *rev and calls
// deliver with the events of every response that has some, in order, then
// advances *rev to the last of them.
// It returns when the watch fails (with the error, rpctypes.ErrCompacted
// when the revision is gone), when deliver returns false, or when ctx is
// done.
//
// The watch is a gRPC watch stream of its own, read in the calling
// goroutine, rather than a watch of the etcd client, which shares one
// stream between watches and hands each response through two goroutines of
// its own before this one: with a thousand watches in a process those
// hand-offs were a fifth of the cost of a change. A stream of its own also
// means that giving up a stuck watch gives up its stream. Its responses
// are decoded by watchCodec, for the same reason. The watch
// requires a leader, so that a member cut off from its cluster ends the
// watch with ErrNoLeader instead of leaving it silent forever. Progress
// notifications are used only as a sign of life, not to advance *rev: etcd
// 3.4 answers a progress request with its current revision even while a
// watcher is still catching up.
func followKeys(ctx context.Context, c *clientv3.Client, key string, prefix bool, rev *int64, deliver func([]*mvccpb.Event) bool) (progressed bool, err error) {
	wctx, cancel := context.WithCancelCause(clientv3.WithRequireLeader(ctx))
	defer cancel(nil)
	ws, err := pb.NewWatchClient(c.ActiveConnection()).Watch(wctx, grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(math.MaxInt32), grpc.ForceCodecV2(watchCodec{}))
	if err != nil {
		return false, watchErr(ctx, wctx, err)
	}
	// Start at *rev, not *rev+1, and drop the repeats: etcd (3.5 and later)
	// answers no progress request while a watcher's start revision is in
	// the future, which *rev+1 is while nothing changes.
	create := &pb.WatchCreateRequest{Key: []byte(key), StartRevision: *rev}
	if prefix {
		create.RangeEnd = []byte(clientv3.GetPrefixRangeEnd(key))
	}
	if err := ws.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: create}}); err != nil {
		return false, watchErr(ctx, wctx, err)
	}
	live := newLiveness(ws, cancel)
	defer live.stop()
	for {
		wr, err := ws.Recv()
		if err != nil {
			return progressed, watchErr(ctx, wctx, err)
		}
		live.heard()
		if wr.CompactRevision != 0 {
			return progressed, rpctypes.ErrCompacted
		}
		if wr.Canceled {
			if wr.CancelReason != "" {
				return progressed, rpctypes.Error(errors.New(wr.CancelReason))
			}
			return progressed, errors.New("watch cancelled by etcd")
		}
		evs := wr.Events
		// Drop what was delivered already: the watch starts at *rev.
		for len(evs) > 0 && evs[0].Kv.ModRevision <= *rev {
			evs = evs[1:]
		}
		if len(evs) == 0 { // created, progress, or a repeat
			continue
		}
		progressed = true
		if !deliver(evs) {
			return progressed, ctx.Err()
		}
		*rev = evs[len(evs)-1].Kv.ModRevision
	}
}

// watchErr is the error of a watch stream that failed with err: ctx's
// error when ctx is done, errUnresponsive when liveness gave the stream up,
// else err as etcd's typed error.
func watchErr(ctx, wctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if cause := context.Cause(wctx); errors.Is(cause, errUnresponsive) {
		return cause
	}
	return rpctypes.Error(err)
}

// liveness asks a silent watch stream for progress (progressAfter), and
// gives it up when no answer comes (progressTimeout). heard, called for
// every response, only stores the time: the timer is set again when it
// fires, to progressAfter after the last response.
type liveness struct {
	ws     pb.Watch_WatchClient
	cancel context.CancelCauseFunc
	start  time.Time    // the clock of last and asked, which count from it
	last   atomic.Int64 // when the stream last delivered something
	mu     sync.Mutex
	timer  *time.Timer
	asked  int64 // when the unanswered progress request went; -1 for none
	done   bool
}

func newLiveness(ws pb.Watch_WatchClient, cancel context.CancelCauseFunc) *liveness {
	l := &liveness{ws: ws, cancel: cancel, start: time.Now(), asked: -1}
	l.mu.Lock() // a check that comes at once waits for timer
	defer l.mu.Unlock()
	l.timer = time.AfterFunc(progressAfter, l.check)
	return l
}

// heard notes that the stream delivered something.
func (l *liveness) heard() { l.last.Store(int64(time.Since(l.start))) }

// check runs when the timer fires.
func (l *liveness) check() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return
	}
	now, last := int64(time.Since(l.start)), l.last.Load()
	if l.asked >= 0 {
		if last < l.asked {
			l.cancel(errUnresponsive)
			return
		}
		l.asked = -1 // answered
	}
	if silent := time.Duration(now - last); silent < progressAfter {
		l.timer.Reset(progressAfter - silent)
		return
	}
	l.asked = now
	// The only Send after the create request; a stream that takes no
	// progress request is given up at the next check.
	if err := l.ws.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}}); err != nil {
		l.cancel(fmt.Errorf("progress request: %w", err))
		return
	}
	l.timer.Reset(progressTimeout)
}

// stop ends the checks. It cancels the stream first, so that a check
// blocked in Send returns.
func (l *liveness) stop() {
	l.timer.Stop()
	l.cancel(nil)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.done = true
}
