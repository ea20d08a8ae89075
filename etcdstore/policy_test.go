package etcdstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/policy"
)

const (
	docYAML = `# the team lanes
lanes:
  alice: {fallback: [team-a]}
canary:
  - {service: orders, lane: team-a, percent: 10}
`
	docJSON    = `{"lanes": {"bob": {"strict": true}}}`
	docYAML2   = "lanes:\n  carol: {strict: true}\n"
	invalidDoc = `canary:
  - {service: orders, lane: team-a, percent: 150}
`
	invalidField = "canary[0].percent"
)

// next reads the next document from w within a few seconds.
func next(t *testing.T, w policy.Watcher) policy.Document {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := w.Next(ctx)
	if err != nil {
		t.Fatalf("policy Next: %v", err)
	}
	return d
}

// quiet checks that w delivers nothing for a moment.
func quiet(t *testing.T, w policy.Watcher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if d, err := w.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("policy Next delivered %q (%v), want nothing", d.Raw, err)
	}
}

func wantPolicyError(t *testing.T, err error) {
	t.Helper()
	var pe *policy.Error
	if !errors.As(err, &pe) || pe.Field != invalidField {
		t.Fatalf("got error %v, want a *policy.Error on %s", err, invalidField)
	}
}

func TestPolicyPutGetWatch(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		ctx := testCtx(t)
		s := open(t, srv)
		ps := s.Policy()

		d, err := ps.Get(ctx)
		if err != nil || d.Revision != 0 || d.Policy == nil || len(d.Policy.Lanes) != 0 || d.Raw != nil {
			t.Fatalf("Get of no document = %+v, %v; want the empty policy at revision 0", d, err)
		}
		w, err := ps.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if d := next(t, w); d.Revision != 0 || len(d.Policy.Lanes) != 0 {
			t.Fatalf("first watched document %+v, want the empty policy", d)
		}

		put, err := ps.Put(ctx, []byte(docYAML))
		if err != nil {
			t.Fatal(err)
		}
		if put.Revision == 0 || string(put.Raw) != docYAML || put.Policy.Lanes["alice"].Fallback[0] != "team-a" {
			t.Fatalf("Put returned %+v", put)
		}
		got, err := ps.Get(ctx)
		if err != nil || got.Revision != put.Revision || string(got.Raw) != docYAML {
			t.Fatalf("Get after Put = %+v, %v", got, err)
		}
		if d := next(t, w); d.Revision != put.Revision || string(d.Raw) != docYAML || len(d.Policy.Canary) != 1 {
			t.Fatalf("watched %+v, want the document put", d)
		}

		// JSON is stored as JSON.
		put2, err := ps.Put(ctx, []byte(docJSON))
		if err != nil {
			t.Fatal(err)
		}
		if d := next(t, w); d.Revision != put2.Revision || string(d.Raw) != docJSON || !d.Policy.Lanes["bob"].Strict {
			t.Fatalf("watched %+v, want the JSON document", d)
		}
		r, err := s.Client().Get(ctx, s.Prefix()+"policy")
		if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != docJSON {
			t.Fatalf("the policy key holds %v, %v; want the text as submitted", r, err)
		}

		// A second watcher starts with the document in force.
		w2, err := ps.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer w2.Close()
		if d := next(t, w2); d.Revision != put2.Revision {
			t.Fatalf("second watcher starts with %+v", d)
		}

		// A watcher that falls behind gets the newest document.
		if _, err := ps.Put(ctx, []byte(docYAML)); err != nil {
			t.Fatal(err)
		}
		put3, err := ps.Put(ctx, []byte(docYAML2))
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			d := next(t, w2)
			if d.Revision == put3.Revision {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("watcher did not reach the newest document")
			}
		}

		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Next(ctx); !errors.Is(err, policy.ErrClosed) {
			t.Fatalf("Next after Close = %v, want ErrClosed", err)
		}
		s.Close()
		if _, err := w2.Next(ctx); !errors.Is(err, policy.ErrClosed) {
			t.Fatalf("Next after the Store closed = %v, want ErrClosed", err)
		}
		if _, err := ps.Get(ctx); !errors.Is(err, policy.ErrClosed) {
			t.Fatalf("Get after the Store closed = %v, want ErrClosed", err)
		}
		if _, err := ps.Put(ctx, []byte(docYAML)); !errors.Is(err, policy.ErrClosed) {
			t.Fatalf("Put after the Store closed = %v, want ErrClosed", err)
		}
		if _, err := ps.Watch(ctx); !errors.Is(err, policy.ErrClosed) {
			t.Fatalf("Watch after the Store closed = %v, want ErrClosed", err)
		}
	})
}

// TestPolicyInvalid checks that Put refuses an invalid document as a whole,
// and that one written into etcd by other means is reported by Get and
// skipped by watchers, which keep the previous one in force.
func TestPolicyInvalid(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		ctx := testCtx(t)
		s := open(t, srv)
		ps := s.Policy()
		key := s.Prefix() + "policy"

		// With no valid document ever stored, a watcher starts with the
		// empty policy, the one in force.
		if _, err := s.Client().Put(ctx, key, invalidDoc); err != nil {
			t.Fatal(err)
		}
		w0, err := ps.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer w0.Close()
		if d := next(t, w0); d.Revision != 0 || len(d.Policy.Canary) != 0 {
			t.Fatalf("with only an invalid document stored, the watcher starts with %+v", d)
		}

		good, err := ps.Put(ctx, []byte(docYAML))
		if err != nil {
			t.Fatal(err)
		}
		if d := next(t, w0); d.Revision != good.Revision {
			t.Fatalf("got %+v", d)
		}
		w, err := ps.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		next(t, w)

		_, err = ps.Put(ctx, []byte(invalidDoc))
		wantPolicyError(t, err)
		if _, err := ps.Put(ctx, []byte("lanes: [not, a, map]\n")); err == nil {
			t.Fatal("Put of a mistyped document succeeded")
		}
		if d, err := ps.Get(ctx); err != nil || d.Revision != good.Revision {
			t.Fatalf("after refused Puts Get = %+v, %v; want the previous document", d, err)
		}
		quiet(t, w)

		// Written directly: Get reports it, watchers skip it.
		r, err := s.Client().Put(ctx, key, invalidDoc)
		if err != nil {
			t.Fatal(err)
		}
		_, err = ps.Get(ctx)
		wantPolicyError(t, err)
		quiet(t, w)
		// A new watcher finds the document in force in etcd's history.
		w2, err := ps.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer w2.Close()
		if d := next(t, w2); d.Revision != good.Revision || string(d.Raw) != docYAML {
			t.Fatalf("new watcher starts with %+v (invalid document at %d), want the one at %d", d, r.Header.Revision, good.Revision)
		}

		// A valid document takes over everywhere.
		put, err := ps.Put(ctx, []byte(docJSON))
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range []policy.Watcher{w, w2} {
			if d := next(t, w); d.Revision != put.Revision {
				t.Fatalf("got %+v, want the document at %d", d, put.Revision)
			}
		}

		// Deleting the key puts the empty policy in force.
		del, err := s.Client().Delete(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if d := next(t, w); d.Revision != del.Header.Revision || len(d.Policy.Lanes) != 0 {
			t.Fatalf("after the delete got %+v, want the empty policy at %d", d, del.Header.Revision)
		}
		if d, err := ps.Get(ctx); err != nil || d.Revision != 0 {
			t.Fatalf("Get after the delete = %+v, %v", d, err)
		}
	})
}

// TestPolicyWatchSurvivesRestart checks that a policy watch resumes after
// etcd restarts and sees the document put before the outage and the one
// put after.
func TestPolicyWatchSurvivesRestart(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		ctx := testCtx(t)
		s := open(t, srv)
		ps := s.Policy()
		w, err := ps.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		next(t, w)
		before, err := ps.Put(ctx, []byte(docYAML))
		if err != nil {
			t.Fatal(err)
		}
		if d := next(t, w); d.Revision != before.Revision {
			t.Fatalf("got %+v", d)
		}
		if err := srv.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		after, err := ps.Put(ctx, []byte(docJSON))
		if err != nil {
			t.Fatal(err)
		}
		if d := next(t, w); d.Revision != after.Revision || string(d.Raw) != docJSON {
			t.Fatalf("after the restart got %+v, want the document at %d", d, after.Revision)
		}
	})
}

// TestPolicyWatchIsolatedByPrefix checks that two Stores with different
// prefixes on one etcd do not see each other's policy.
func TestPolicyWatchIsolatedByPrefix(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		ctx := testCtx(t)
		a, b := open(t, srv), open(t, srv)
		wb, err := b.Policy().Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer wb.Close()
		next(t, wb)
		if _, err := a.Policy().Put(ctx, []byte(docYAML)); err != nil {
			t.Fatal(err)
		}
		quiet(t, wb)
		if d, err := b.Policy().Get(ctx); err != nil || d.Revision != 0 {
			t.Fatalf("another prefix's Get = %+v, %v", d, err)
		}
	})
}
