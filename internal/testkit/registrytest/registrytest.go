// Package registrytest is the conformance suite of registry backends: every
// implementation of registry.Registry must pass Run.
//
// The suite checks what callers rely on: a watch starts with a reset batch
// that lists what exists, then delivers every put and delete in order with
// growing revisions; the service filter; validation errors that name the
// field; replacement of an ID by a newer registration; and Close semantics
// (idempotent, ErrClosed afterwards). It does not check lease expiry, which
// only a backend with other processes can show. When the backend's watchers
// are registry.Pushers, every test runs again with the batches taken
// through Push (the push/ subtests).
package registrytest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lanesdev/lanes/registry"
)

// Timeout bounds every wait of the suite.
const Timeout = 20 * time.Second

// TTL is the lease TTL the suite registers with; long enough that no lease
// expires during a test.
const TTL = 30 * time.Second

// Run runs the suite as subtests of t. newRegistry returns a fresh, empty
// registry for each subtest; the suite closes it (Close must be idempotent).
func Run(t *testing.T, newRegistry func(t *testing.T) registry.Registry) {
	tests := []struct {
		name string
		fn   func(t *testing.T, r registry.Registry)
	}{
		{"ResetFirst", testResetFirst},
		{"PutUpdateDelete", testPutUpdateDelete},
		{"OrderAndRevisions", testOrderAndRevisions},
		{"ServiceFilter", testServiceFilter},
		{"WatchAll", testWatchAll},
		{"Validation", testValidation},
		{"Replace", testReplace},
		{"LeaseClose", testLeaseClose},
		{"WatcherClose", testWatcherClose},
		{"RegistryClose", testRegistryClose},
		{"NextContext", testNextContext},
		{"Concurrent", testConcurrent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRegistry(t)
			t.Cleanup(func() { r.Close() })
			tc.fn(t, r)
		})
	}
	if !pushes(t, newRegistry) {
		return
	}
	for _, tc := range tests {
		t.Run("push/"+tc.name, func(t *testing.T) {
			r := newRegistry(t)
			t.Cleanup(func() { r.Close() })
			tc.fn(t, pushRegistry{r})
		})
	}
}

// pushes reports whether the watchers of newRegistry's registries are
// registry.Pushers.
func pushes(t *testing.T, newRegistry func(t *testing.T) registry.Registry) bool {
	r := newRegistry(t)
	defer r.Close()
	w, err := r.Watch(ctx(t), "orders")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer w.Close()
	_, ok := w.(registry.Pusher)
	return ok
}

// pushRegistry is a registry whose watchers are read through Push: their
// Next returns what Push handed over.
type pushRegistry struct{ registry.Registry }

func (r pushRegistry) Watch(ctx context.Context, service string) (registry.Watcher, error) {
	w, err := r.Registry.Watch(ctx, service)
	if err != nil {
		return nil, err
	}
	p := &pushed{w: w, more: make(chan struct{}, 1)}
	p.done = w.(registry.Pusher).Push(p.add)
	return p, nil
}

// pushed is a registry.Watcher made of a Pusher: Push's batches queue up
// for Next.
type pushed struct {
	w    registry.Watcher
	done <-chan struct{}
	more chan struct{} // a batch was queued; capacity 1

	mu     sync.Mutex
	queue  []registry.Batch
	closed bool
}

// add queues b, in the Pusher's goroutine, without waiting.
func (p *pushed) add(b registry.Batch) {
	p.mu.Lock()
	p.queue = append(p.queue, b)
	p.mu.Unlock()
	select {
	case p.more <- struct{}{}:
	default:
	}
}

func (p *pushed) Next(ctx context.Context) (registry.Batch, error) {
	for {
		p.mu.Lock()
		closed, n := p.closed, len(p.queue)
		var b registry.Batch
		if !closed && n > 0 {
			b, p.queue = p.queue[0], p.queue[1:]
		}
		p.mu.Unlock()
		switch {
		case closed:
			return registry.Batch{}, registry.ErrClosed
		case n > 0:
			return b, nil
		}
		select {
		case <-p.more:
		case <-p.done:
			p.mu.Lock()
			n := len(p.queue)
			p.mu.Unlock()
			if n == 0 {
				return registry.Batch{}, registry.ErrClosed
			}
		case <-ctx.Done():
			return registry.Batch{}, ctx.Err()
		}
	}
}

func (p *pushed) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	return p.w.Close()
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), Timeout)
	t.Cleanup(cancel)
	return c
}

func inst(service, id string, port int) registry.Instance {
	return registry.Instance{Service: service, ID: id, Addr: fmt.Sprintf("10.0.0.1:%d", port)}
}

func register(t *testing.T, r registry.Registry, in registry.Instance) registry.Lease {
	t.Helper()
	l, err := r.Register(ctx(t), in, TTL)
	if err != nil {
		t.Fatalf("Register(%s/%s): %v", in.Service, in.ID, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func watch(t *testing.T, r registry.Registry, service string) registry.Watcher {
	t.Helper()
	w, err := r.Watch(ctx(t), service)
	if err != nil {
		t.Fatalf("Watch(%q): %v", service, err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// stream reads a watcher and checks the invariants of every batch as it goes.
type stream struct {
	t       *testing.T
	w       registry.Watcher
	pending []registry.Event
	lastRev int64
	lastEv  int64
	batches int
}

func newStream(t *testing.T, w registry.Watcher) *stream { return &stream{t: t, w: w} }

// next returns the next batch, checking revisions.
func (s *stream) next() registry.Batch {
	s.t.Helper()
	b, err := s.w.Next(ctx(s.t))
	if err != nil {
		s.t.Fatalf("Next: %v", err)
	}
	if s.batches == 0 && !b.Reset {
		s.t.Fatalf("first batch is not a reset: %+v", b)
	}
	s.batches++
	if b.Revision < s.lastRev {
		s.t.Fatalf("batch revision went back: %d after %d", b.Revision, s.lastRev)
	}
	if !b.Reset {
		if len(b.Events) == 0 {
			s.t.Fatalf("empty non-reset batch at revision %d", b.Revision)
		}
		if b.Revision <= s.lastRev {
			s.t.Fatalf("non-reset batch revision %d not after %d", b.Revision, s.lastRev)
		}
		for _, ev := range b.Events {
			if ev.Revision <= s.lastEv {
				s.t.Fatalf("event revision %d not after %d: %+v", ev.Revision, s.lastEv, ev)
			}
			if ev.Revision > b.Revision {
				s.t.Fatalf("event revision %d after its batch's %d", ev.Revision, b.Revision)
			}
			s.lastEv = ev.Revision
		}
		if last := b.Events[len(b.Events)-1].Revision; last != b.Revision {
			s.t.Fatalf("batch revision %d, last event %d", b.Revision, last)
		}
	} else {
		for _, ev := range b.Events {
			if ev.Type != registry.EventPut {
				s.t.Fatalf("reset batch holds a %v event", ev.Type)
			}
			if ev.Revision > b.Revision {
				s.t.Fatalf("reset event revision %d after the batch's %d", ev.Revision, b.Revision)
			}
		}
		s.lastEv = b.Revision
	}
	s.lastRev = b.Revision
	return b
}

// reset reads the first batch and returns its instances by service/id.
func (s *stream) reset() map[string]registry.Instance {
	s.t.Helper()
	b := s.next()
	if !b.Reset {
		s.t.Fatalf("want a reset batch, got %+v", b)
	}
	m := map[string]registry.Instance{}
	for _, ev := range b.Events {
		k := ev.Instance.Service + "/" + ev.Instance.ID
		if _, dup := m[k]; dup {
			s.t.Fatalf("reset batch lists %s twice", k)
		}
		m[k] = ev.Instance
	}
	return m
}

// events returns the next n events, across batches; a reset fails the test.
func (s *stream) events(n int) []registry.Event {
	s.t.Helper()
	for len(s.pending) < n {
		b := s.next()
		if b.Reset {
			s.t.Fatalf("unexpected reset batch after %d of %d events", len(s.pending), n)
		}
		s.pending = append(s.pending, b.Events...)
	}
	out := s.pending[:n:n]
	s.pending = s.pending[n:]
	return out
}

func (s *stream) event() registry.Event { s.t.Helper(); return s.events(1)[0] }

func wantPut(t *testing.T, ev registry.Event, want registry.Instance) {
	t.Helper()
	want, err := registry.Normalize(want)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Type != registry.EventPut || !ev.Instance.Equal(want) {
		t.Fatalf("got %v %+v, want put %+v", ev.Type, ev.Instance, want)
	}
}

func wantDelete(t *testing.T, ev registry.Event, service, id string) {
	t.Helper()
	if ev.Type != registry.EventDelete || ev.Instance.Service != service || ev.Instance.ID != id {
		t.Fatalf("got %v %s/%s, want delete %s/%s", ev.Type, ev.Instance.Service, ev.Instance.ID, service, id)
	}
}

func testResetFirst(t *testing.T, r registry.Registry) {
	a := inst("orders", "a", 1)
	a.Lane = "Feature-X" // normalised to lower case
	a.Labels = map[string]string{"version": "2"}
	b := inst("orders", "b", 2)
	b.Weight = 7
	c := inst("billing", "c", 3)
	for _, in := range []registry.Instance{a, b, c} {
		register(t, r, in)
	}
	got := newStream(t, watch(t, r, "orders")).reset()
	if len(got) != 2 {
		t.Fatalf("reset of orders lists %d instances, want 2: %v", len(got), got)
	}
	for _, in := range []registry.Instance{a, b} {
		want, _ := registry.Normalize(in)
		if g := got["orders/"+in.ID]; !g.Equal(want) {
			t.Fatalf("reset lists %+v, want %+v", g, want)
		}
	}
	if got["orders/a"].Lane != "feature-x" || got["orders/a"].Weight != registry.DefaultWeight {
		t.Fatalf("instance not normalised: %+v", got["orders/a"])
	}
	if all := newStream(t, watch(t, r, "")).reset(); len(all) != 3 {
		t.Fatalf("reset of all services lists %d instances, want 3", len(all))
	}
	if none := newStream(t, watch(t, r, "nothing")).reset(); len(none) != 0 {
		t.Fatalf("reset of an unknown service lists %v", none)
	}
}

func testPutUpdateDelete(t *testing.T, r registry.Registry) {
	s := newStream(t, watch(t, r, "orders"))
	if got := s.reset(); len(got) != 0 {
		t.Fatalf("empty registry lists %v", got)
	}
	a := inst("orders", "a", 1)
	l := register(t, r, a)
	wantPut(t, s.event(), a)

	a.Drain = true
	a.Labels = map[string]string{"k": "v"}
	if err := l.Update(ctx(t), a); err != nil {
		t.Fatal(err)
	}
	wantPut(t, s.event(), a)
	if got := l.Instance(); !got.Drain || got.Labels["k"] != "v" {
		t.Fatalf("Instance() after Update = %+v", got)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	wantDelete(t, s.event(), "orders", "a")
}

func testOrderAndRevisions(t *testing.T, r registry.Registry) {
	s := newStream(t, watch(t, r, ""))
	s.reset()
	type op struct {
		typ registry.EventType
		in  registry.Instance
	}
	var ops []op
	leases := map[string]registry.Lease{}
	for i := range 60 {
		id := fmt.Sprintf("i%d", i%7)
		svc := []string{"orders", "billing"}[i%2]
		key := svc + "/" + id
		switch l := leases[key]; {
		case l == nil:
			in := inst(svc, id, 1000+i)
			leases[key] = register(t, r, in)
			ops = append(ops, op{registry.EventPut, in})
		case i%3 == 0:
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			delete(leases, key)
			ops = append(ops, op{registry.EventDelete, registry.Instance{Service: svc, ID: id}})
		default:
			in := l.Instance()
			in.Weight = i + 1
			if err := l.Update(ctx(t), in); err != nil {
				t.Fatal(err)
			}
			ops = append(ops, op{registry.EventPut, in})
		}
	}
	got := s.events(len(ops))
	for i, o := range ops {
		if o.typ == registry.EventPut {
			wantPut(t, got[i], o.in)
		} else {
			wantDelete(t, got[i], o.in.Service, o.in.ID)
		}
	}
}

func testServiceFilter(t *testing.T, r registry.Registry) {
	s := newStream(t, watch(t, r, "orders"))
	s.reset()
	register(t, r, inst("billing", "x", 1))
	register(t, r, inst("orders-eu", "y", 2)) // a longer name, same start
	o := inst("orders", "z", 3)
	register(t, r, o)
	wantPut(t, s.event(), o)
}

func testWatchAll(t *testing.T, r registry.Registry) {
	s := newStream(t, watch(t, r, ""))
	s.reset()
	a, b := inst("billing", "x", 1), inst("orders", "y", 2)
	la := register(t, r, a)
	register(t, r, b)
	la.Close()
	evs := s.events(3)
	wantPut(t, evs[0], a)
	wantPut(t, evs[1], b)
	wantDelete(t, evs[2], "billing", "x")
}

func testValidation(t *testing.T, r registry.Registry) {
	good := inst("orders", "a", 1)
	cases := []struct {
		field string
		edit  func(*registry.Instance)
		ttl   time.Duration
	}{
		{"service", func(in *registry.Instance) { in.Service = "" }, TTL},
		{"service", func(in *registry.Instance) { in.Service = "a/b" }, TTL},
		{"id", func(in *registry.Instance) { in.ID = "" }, TTL},
		{"id", func(in *registry.Instance) { in.ID = ".." }, TTL},
		{"addr", func(in *registry.Instance) { in.Addr = "nope" }, TTL},
		{"addr", func(in *registry.Instance) { in.Addr = "h:0" }, TTL},
		{"lane", func(in *registry.Instance) { in.Lane = "no spaces" }, TTL},
		{"weight", func(in *registry.Instance) { in.Weight = -1 }, TTL},
		{"labels", func(in *registry.Instance) { in.Labels = map[string]string{"": "v"} }, TTL},
		{"ttl", func(*registry.Instance) {}, -time.Second},
	}
	for _, c := range cases {
		in := good.Clone()
		c.edit(&in)
		l, err := r.Register(ctx(t), in, c.ttl)
		var fe *registry.FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			if l != nil {
				l.Close()
			}
			t.Errorf("Register(%+v, %v) = %v, want a FieldError on %q", in, c.ttl, err, c.field)
		}
	}

	s := newStream(t, watch(t, r, "orders"))
	s.reset()
	l := register(t, r, good)
	wantPut(t, s.event(), good)
	for _, c := range []struct {
		field string
		edit  func(*registry.Instance)
	}{
		{"id", func(in *registry.Instance) { in.ID = "b" }},
		{"id", func(in *registry.Instance) { in.Service = "billing" }},
		{"addr", func(in *registry.Instance) { in.Addr = "" }},
		{"weight", func(in *registry.Instance) { in.Weight = registry.MaxWeight + 1 }},
	} {
		in := good.Clone()
		c.edit(&in)
		err := l.Update(ctx(t), in)
		var fe *registry.FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("Update(%+v) = %v, want a FieldError on %q", in, err, c.field)
		}
	}
	if got := l.Instance(); got.Addr != good.Addr {
		t.Fatalf("a refused Update changed the instance: %+v", got)
	}
	// Nothing was published by the refused calls: the next event is ours.
	marker := inst("orders", "marker", 9)
	register(t, r, marker)
	wantPut(t, s.event(), marker)
}

func testReplace(t *testing.T, r registry.Registry) {
	s := newStream(t, watch(t, r, "orders"))
	s.reset()
	first := inst("orders", "a", 1)
	l1 := register(t, r, first)
	wantPut(t, s.event(), first)
	second := inst("orders", "a", 2)
	l2 := register(t, r, second)
	wantPut(t, s.event(), second)

	// The replaced lease no longer owns the instance: its Update and Close
	// change nothing that watchers see.
	upd := first.Clone()
	upd.Drain = true
	if err := l1.Update(ctx(t), upd); err != nil {
		t.Fatalf("Update of a replaced lease: %v", err)
	}
	if err := l1.Close(); err != nil {
		t.Fatalf("Close of a replaced lease: %v", err)
	}
	marker := inst("orders", "marker", 9)
	register(t, r, marker)
	wantPut(t, s.event(), marker)

	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	wantDelete(t, s.event(), "orders", "a")
}

func testLeaseClose(t *testing.T, r registry.Registry) {
	l := register(t, r, inst("orders", "a", 1))
	select {
	case <-l.Done():
		t.Fatal("Done closed on a live lease")
	default:
	}
	if err := l.Err(); err != nil {
		t.Fatalf("Err() on a live lease = %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("Done not closed after Close")
	}
	if err := l.Err(); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Err() after Close = %v, want ErrClosed", err)
	}
	if err := l.Update(ctx(t), inst("orders", "a", 2)); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Update after Close = %v, want ErrClosed", err)
	}
	if got := newStream(t, watch(t, r, "orders")).reset(); len(got) != 0 {
		t.Fatalf("closed lease still listed: %v", got)
	}
}

func testWatcherClose(t *testing.T, r registry.Registry) {
	w, err := r.Watch(ctx(t), "orders")
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if _, err := w.Next(ctx(t)); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Next after Close = %v, want ErrClosed", err)
	}
	// Close while another goroutine waits in Next.
	w2 := watch(t, r, "orders")
	newStream(t, w2).reset()
	errc := make(chan error, 1)
	go func() {
		_, err := w2.Next(ctx(t))
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	w2.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, registry.ErrClosed) {
			t.Fatalf("blocked Next after Close = %v, want ErrClosed", err)
		}
	case <-time.After(Timeout):
		t.Fatal("Close did not end a blocked Next")
	}
}

func testRegistryClose(t *testing.T, r registry.Registry) {
	l := register(t, r, inst("orders", "a", 1))
	w := watch(t, r, "orders")
	newStream(t, w).reset()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if _, err := w.Next(ctx(t)); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Next after the registry closed = %v, want ErrClosed", err)
	}
	if _, err := r.Register(ctx(t), inst("orders", "b", 2), TTL); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Register after Close = %v, want ErrClosed", err)
	}
	if _, err := r.Watch(ctx(t), "orders"); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Watch after Close = %v, want ErrClosed", err)
	}
	if err := l.Update(ctx(t), inst("orders", "a", 3)); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Update after the registry closed = %v, want ErrClosed", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("lease Close after the registry closed = %v", err)
	}
}

func testNextContext(t *testing.T, r registry.Registry) {
	w := watch(t, r, "orders")
	s := newStream(t, w)
	s.reset()
	c, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := w.Next(c); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next with an expiring context = %v, want DeadlineExceeded", err)
	}
	// The watch is still usable.
	a := inst("orders", "a", 1)
	register(t, r, a)
	wantPut(t, s.event(), a)
}

func testConcurrent(t *testing.T, r registry.Registry) {
	s := newStream(t, watch(t, r, ""))
	s.reset()
	const workers, rounds = 6, 5
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for wi := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := ctx(t)
			for round := range rounds {
				in := inst("svc", fmt.Sprintf("w%d-%d", wi, round), 1000+wi)
				l, err := r.Register(c, in, TTL)
				if err != nil {
					errc <- err
					return
				}
				in.Weight = 5
				if err := l.Update(c, in); err != nil {
					errc <- err
					return
				}
				if round%2 == 0 {
					if err := l.Close(); err != nil {
						errc <- err
						return
					}
				} else {
					t.Cleanup(func() { l.Close() })
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	// 2 events per registration, plus a delete for every even round.
	n := workers * (2*rounds + (rounds+1)/2)
	var st registry.State
	st.Apply(registry.Batch{Reset: true})
	for _, ev := range s.events(n) {
		st.Apply(registry.Batch{Events: []registry.Event{ev}, Revision: ev.Revision})
	}
	got := st.Instances("svc")
	if want := workers * (rounds / 2); len(got) != want {
		t.Fatalf("%d instances after the concurrent changes, want %d: %v", len(got), want, got)
	}
	for _, in := range got {
		if in.Weight != 5 {
			t.Fatalf("instance %s missed its update: %+v", in.ID, in)
		}
	}
}
