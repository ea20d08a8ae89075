package etcdstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/registry"
)

// collect reads n events from w across batches; a reset fails the test.
func collect(t *testing.T, ctx context.Context, w registry.Watcher, n int) []registry.Event {
	t.Helper()
	var out []registry.Event
	var last int64
	for len(out) < n {
		b, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("Next after %d of %d events: %v", len(out), n, err)
		}
		if b.Reset {
			t.Fatalf("unexpected reset batch after %d of %d events", len(out), n)
		}
		for _, ev := range b.Events {
			if ev.Revision <= last {
				t.Fatalf("event revision %d not after %d", ev.Revision, last)
			}
			last = ev.Revision
		}
		out = append(out, b.Events...)
	}
	if len(out) > n {
		t.Fatalf("got %d events, want %d: %+v", len(out), n, out[n:])
	}
	return out
}

// TestWatchSeesEveryChange makes 200 changes from concurrent registrations
// and checks that a watch delivers every one, in etcd's order: the same
// keys, types and revisions as a raw etcd watch of the prefix, and each
// registration's own changes in the order it made them.
func TestWatchSeesEveryChange(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		ctx := testCtx(t)
		s := open(t, srv)
		w := watchStore(t, s, "")
		first, err := w.Next(ctx)
		if err != nil || !first.Reset {
			t.Fatalf("%+v %v", first, err)
		}
		rawCtx, cancelRaw := context.WithCancel(ctx)
		defer cancelRaw()
		raw := s.Client().Watch(rawCtx, s.Prefix()+"instances/", clientv3.WithPrefix(), clientv3.WithRev(first.Revision+1))

		// 10 workers x 4 instances x (register, 3 updates, close) = 200.
		const workers, perWorker, updates = 10, 4, 3
		const total = workers * perWorker * (updates + 2)
		type change struct {
			typ    registry.EventType
			id     string
			weight int
		}
		want := make([][]change, workers)
		var wg sync.WaitGroup
		errc := make(chan error, workers)
		for wi := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range perWorker {
					in := inst(fmt.Sprintf("svc%d", wi%3), fmt.Sprintf("w%d-%d", wi, k), 2000+wi)
					in.Weight = 1
					l, err := s.Register(ctx, in, 10*time.Second)
					if err != nil {
						errc <- err
						return
					}
					want[wi] = append(want[wi], change{registry.EventPut, in.ID, 1})
					for u := range updates {
						in.Weight = u + 2
						if err := l.Update(ctx, in); err != nil {
							errc <- err
							return
						}
						want[wi] = append(want[wi], change{registry.EventPut, in.ID, in.Weight})
					}
					if err := l.Close(); err != nil {
						errc <- err
						return
					}
					want[wi] = append(want[wi], change{registry.EventDelete, in.ID, 0})
				}
			}()
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			t.Fatal(err)
		}

		got := collect(t, ctx, w, total)
		var rawEvs []*clientv3.Event
		for len(rawEvs) < total {
			wr, ok := <-raw
			if !ok || wr.Err() != nil {
				t.Fatalf("raw watch ended after %d events: %v", len(rawEvs), wr.Err())
			}
			rawEvs = append(rawEvs, wr.Events...)
		}
		for i, ev := range got {
			r := rawEvs[i]
			key := s.Prefix() + "instances/" + ev.Instance.Service + "/" + ev.Instance.ID
			typ := registry.EventPut
			if r.Type == clientv3.EventTypeDelete {
				typ = registry.EventDelete
			}
			if ev.Revision != r.Kv.ModRevision || ev.Type != typ || key != string(r.Kv.Key) {
				t.Fatalf("event %d: got %v %s at %d, etcd has %v %s at %d", i, ev.Type, key, ev.Revision, typ, r.Kv.Key, r.Kv.ModRevision)
			}
		}
		// Each worker's changes, in its order.
		for wi := range workers {
			var seen []change
			prefix := fmt.Sprintf("w%d-", wi)
			for _, ev := range got {
				if len(ev.Instance.ID) > len(prefix) && ev.Instance.ID[:len(prefix)] == prefix {
					seen = append(seen, change{ev.Type, ev.Instance.ID, ev.Instance.Weight})
				}
			}
			if fmt.Sprint(seen) != fmt.Sprint(want[wi]) {
				t.Fatalf("worker %d: saw %v, made %v", wi, seen, want[wi])
			}
		}
	})
}

// TestWatchSurvivesRestart makes changes, stops etcd for longer than the
// lease TTL, starts it again on the same data and ports, makes more changes
// and checks that the watch saw all of them, in order, without a reset, and
// that the registration made before the outage is still alive.
func TestWatchSurvivesRestart(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		ctx := testCtx(t)
		// Long enough that a renewal delayed by a loaded machine (-race,
		// other builds) does not lose a lease; the outage is longer still.
		const ttl = 5 * time.Second
		s := open(t, srv)
		w := watchStore(t, s, "")
		if b, err := w.Next(ctx); err != nil || !b.Reset {
			t.Fatalf("%+v %v", b, err)
		}
		type change struct {
			typ  registry.EventType
			id   string
			addr string
		}
		var want []change
		a := inst("orders", "a", 1)
		la, err := s.Register(ctx, a, ttl)
		if err != nil {
			t.Fatal(err)
		}
		defer la.Close()
		want = append(want, change{registry.EventPut, "a", a.Addr})
		lb, err := s.Register(ctx, inst("orders", "b", 2), ttl)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, change{registry.EventPut, "b", inst("", "", 2).Addr})
		a.Addr = "10.1.0.1:11"
		if err := la.Update(ctx, a); err != nil {
			t.Fatal(err)
		}
		want = append(want, change{registry.EventPut, "a", a.Addr})
		if err := lb.Close(); err != nil {
			t.Fatal(err)
		}
		want = append(want, change{registry.EventDelete, "b", ""})
		// Make sure the watch has delivered them before the outage, so
		// that what follows is a resumption, not a first delivery.
		before := collect(t, ctx, w, len(want))

		stopping := time.Now()
		if err := srv.Kill(); err != nil {
			t.Fatal(err)
		}
		t.Logf("stopped in %v", time.Since(stopping).Round(time.Millisecond))
		time.Sleep(ttl + 500*time.Millisecond)
		starting := time.Now()
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		restarted := time.Now()
		t.Logf("started in %v", restarted.Sub(starting).Round(time.Millisecond))
		// Requests fail at once while the Store sees no quorum; it sees the
		// member back at its next check.
		waitFor(t, "the Store to see etcd back", func() bool {
			h, ok := s.Health()
			return !ok || h.State != etcdstore.HealthNoQuorum
		})

		lc, err := s.Register(ctx, inst("billing", "c", 3), ttl)
		if err != nil {
			t.Fatal(err)
		}
		defer lc.Close()
		want = append(want, change{registry.EventPut, "c", inst("", "", 3).Addr})
		a.Addr = "10.1.0.1:12"
		if err := la.Update(ctx, a); err != nil {
			t.Fatal(err)
		}
		want = append(want, change{registry.EventPut, "a", a.Addr})

		// The watch resumes where it was. If a's lease expired in etcd
		// before the client reached it again, the Lease registered a again:
		// a delete of a then a put of a as it was last registered may be
		// interleaved; nothing else may be.
		got := before
		var st registry.State
		for _, ev := range before {
			st.Apply(registry.Batch{Events: []registry.Event{ev}, Revision: ev.Revision})
		}
		wantAfter := want[len(before):]
		lastA := "10.1.0.1:11"
		reregistered := false
		for len(wantAfter) > 0 || len(st.Services["orders"]) == 0 {
			b, err := w.Next(ctx)
			if err != nil || b.Reset {
				t.Fatalf("after the restart: batch %+v, %v; want changes (got so far: %+v)", b, err, got)
			}
			for _, ev := range b.Events {
				if ev.Revision <= got[len(got)-1].Revision {
					t.Fatalf("revision %d not after %d", ev.Revision, got[len(got)-1].Revision)
				}
				got = append(got, ev)
				st.Apply(registry.Batch{Events: []registry.Event{ev}, Revision: ev.Revision})
				c := change{ev.Type, ev.Instance.ID, ev.Instance.Addr}
				switch {
				case len(wantAfter) > 0 && c == wantAfter[0]:
					if c.id == "a" {
						lastA = c.addr
					}
					wantAfter = wantAfter[1:]
				case c == change{registry.EventDelete, "a", ""}, c == change{registry.EventPut, "a", lastA}:
					reregistered = true
				default:
					t.Fatalf("unexpected event %+v after the restart; want %+v (all: %+v)", c, wantAfter, got)
				}
			}
		}
		t.Logf("watch caught up %v after the restart; lease re-established: %v", time.Since(restarted).Round(time.Millisecond), reregistered)
		if in := st.Services["orders"]["a"]; in.Addr != a.Addr {
			t.Fatalf("a is %+v after the restart, want addr %s", in, a.Addr)
		}

		// a's lease is renewed after the restart: a outlives its TTL and
		// no delete arrives.
		nctx, cancel := context.WithTimeout(ctx, ttl+time.Second)
		defer cancel()
		if b, err := w.Next(nctx); err == nil {
			t.Fatalf("unexpected batch after the restart: %+v", b)
		}
		select {
		case <-la.Done():
			t.Fatalf("lease ended: %v", la.Err())
		default:
		}
		r, err := s.Client().Get(ctx, s.Prefix()+"instances/orders/a")
		if err != nil || len(r.Kvs) != 1 {
			t.Fatalf("a is not registered after the restart: %v %v", r, err)
		}
		ttlr, err := s.Client().TimeToLive(ctx, clientv3.LeaseID(r.Kvs[0].Lease))
		if err != nil || ttlr.TTL < 0 {
			t.Fatalf("a's lease after the restart: %+v %v", ttlr, err)
		}
	})
}

// TestWatchRelistsAfterCompaction starts a watch from a revision that etcd
// has compacted away: the watch must list again and send a reset batch with
// what exists, then follow changes as usual.
func TestWatchRelistsAfterCompaction(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		ctx := testCtx(t)
		s := open(t, srv)
		r, err := s.Client().Get(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		rev0 := r.Header.Revision
		la, err := s.Register(ctx, inst("orders", "a", 1), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer la.Close()
		lb, err := s.Register(ctx, inst("orders", "b", 2), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		lb.Close()
		if _, err := s.Policy().Put(ctx, []byte("lanes: {alice: {strict: true}}\n")); err != nil {
			t.Fatal(err)
		}
		cr, err := s.Client().Compact(ctx, mustRev(t, s), clientv3.WithCompactPhysical())
		if err != nil {
			t.Fatal(err)
		}
		_ = cr

		w, err := etcdstore.WatchFrom(s, rev0)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		b, err := w.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !b.Reset || len(b.Events) != 1 || b.Events[0].Instance.ID != "a" {
			t.Fatalf("after compaction want a reset listing a, got %+v", b)
		}
		lc, err := s.Register(ctx, inst("orders", "c", 3), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer lc.Close()
		if evs := collect(t, ctx, w, 1); evs[0].Instance.ID != "c" {
			t.Fatalf("got %+v", evs)
		}

		pw, err := etcdstore.PolicyWatchFrom(s, rev0)
		if err != nil {
			t.Fatal(err)
		}
		defer pw.Close()
		doc, err := pw.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !doc.Policy.Lanes["alice"].Strict {
			t.Fatalf("after compaction the policy watch has %+v", doc.Policy)
		}
	})
}

// mustRev returns etcd's current revision.
func mustRev(t *testing.T, s *etcdstore.Store) int64 {
	t.Helper()
	r, err := s.Client().Get(testCtx(t), "x")
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

// TestInvalidInstancesSkipped writes values into etcd that are not valid
// instances and checks that watches log and skip them, never fail.
func TestInvalidInstancesSkipped(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		ctx := testCtx(t)
		s := open(t, srv)
		c := s.Client()
		p := s.Prefix() + "instances/"
		other, _ := json.Marshal(inst("orders", "other", 1))
		valid, _ := json.Marshal(inst("orders", "deep", 1))
		for k, v := range map[string]string{
			p + "orders/bad":      "{not json",
			p + "orders/mismatch": string(other), // names another instance
			p + "orders/deep/x":   string(valid), // not <service>/<id>
			p + "orders/badaddr":  `{"id":"badaddr","service":"orders","addr":"nowhere"}`,
		} {
			if _, err := c.Put(ctx, k, v); err != nil {
				t.Fatal(err)
			}
		}
		la, err := s.Register(ctx, inst("orders", "a", 1), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer la.Close()
		for _, svc := range []string{"orders", ""} {
			w, err := s.Watch(ctx, svc)
			if err != nil {
				t.Fatal(err)
			}
			b, err := w.Next(ctx)
			w.Close()
			if err != nil || !b.Reset || len(b.Events) != 1 || b.Events[0].Instance.ID != "a" {
				t.Fatalf("Watch(%q) first batch %+v, %v; want only a", svc, b, err)
			}
		}

		w := watchStore(t, s, "")
		w.Next(ctx)
		// Garbage over a valid instance: it is gone.
		if _, err := c.Put(ctx, p+"orders/a", "garbage"); err != nil {
			t.Fatal(err)
		}
		// Garbage over garbage, and a bad key: nothing to deliver.
		if _, err := c.Put(ctx, p+"orders/bad", "more garbage"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Put(ctx, p+"orders/deep/y", string(valid)); err != nil {
			t.Fatal(err)
		}
		// Deleting garbage: nothing to deliver either.
		if _, err := c.Delete(ctx, p+"orders/bad"); err != nil {
			t.Fatal(err)
		}
		// Garbage under a new key: nothing; then garbage over it, a valid
		// instance over that (its put), and garbage over the instance (its
		// delete).
		n, _ := json.Marshal(inst("orders", "n", 1))
		for _, v := range []string{"garbage", "more garbage", string(n), "garbage again"} {
			if _, err := c.Put(ctx, p+"orders/n", v); err != nil {
				t.Fatal(err)
			}
		}
		lm, err := s.Register(ctx, inst("orders", "m", 2), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer lm.Close()
		evs := collect(t, ctx, w, 4)
		if evs[0].Type != registry.EventDelete || evs[0].Instance.ID != "a" {
			t.Fatalf("garbage over a: got %+v, want a's delete", evs[0])
		}
		if evs[1].Type != registry.EventPut || evs[1].Instance.ID != "n" {
			t.Fatalf("an instance over garbage: got %+v, want n's put", evs[1])
		}
		if evs[2].Type != registry.EventDelete || evs[2].Instance.ID != "n" {
			t.Fatalf("garbage over n: got %+v, want n's delete", evs[2])
		}
		if evs[3].Type != registry.EventPut || evs[3].Instance.ID != "m" {
			t.Fatalf("got %+v, want m's put", evs[3])
		}
	})
}

// countingHandler counts the log records whose message contains a string.
type countingHandler struct {
	slog.Handler
	substr string
	n      *atomic.Int64
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.substr) {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return countingHandler{h.Handler.WithAttrs(as), h.substr, h.n}
}

// TestIdleWatchStaysUp keeps registry and policy watches idle through many
// progress checks and checks that none was taken for stuck, and that they
// still deliver.
func TestIdleWatchStaysUp(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		ctx := testCtx(t)
		var restarts atomic.Int64
		log := slog.New(countingHandler{testLogger.Handler(), "interrupted", &restarts})
		s, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: srv.Endpoints(), Options: etcdstore.Options{Prefix: uniquePrefix(), Logger: log}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		w := watchStore(t, s, "")
		w.Next(ctx)
		pw, err := s.Policy().Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer pw.Close()
		next(t, pw)

		// Writes elsewhere move etcd's revision, so that the idle
		// watches ask for progress (six times or so).
		other := etcdtest.Client(t, srv.Endpoints())
		for range 15 {
			if _, err := other.Put(ctx, "/elsewhere/x", "y"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if n := restarts.Load(); n != 0 {
			t.Fatalf("idle watches restarted %d times", n)
		}
		l, err := s.Register(ctx, inst("orders", "a", 1), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if evs := collect(t, ctx, w, 1); evs[0].Instance.ID != "a" {
			t.Fatalf("got %+v", evs)
		}
		if _, err := s.Policy().Put(ctx, []byte(docYAML)); err != nil {
			t.Fatal(err)
		}
		if d := next(t, pw); string(d.Raw) != docYAML {
			t.Fatalf("got %+v", d)
		}
	})
}
