package etcdstore

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lanesdev/lanes/policy"
)

// maxHistory bounds how many older versions of the policy key a watch reads
// back to find the document in force when the stored one is invalid.
const maxHistory = 100

// policyStore is the policy.Store of a Store: one key, <prefix>policy,
// holding the document text as submitted.
type policyStore struct {
	s   *Store
	key string
}

var _ policy.Store = (*policyStore)(nil)

// Get implements policy.Store. With no document stored it returns
// policy.Empty(); when the stored text is invalid (it was written by other
// means than Put) it returns the *policy.Error that says why, naming the key
// as the file.
func (p *policyStore) Get(ctx context.Context) (policy.Document, error) {
	if err := ctx.Err(); err != nil {
		return policy.Document{}, err
	}
	if p.s.g.Closed() {
		return policy.Document{}, policy.ErrClosed
	}
	resp, err := p.s.client.Get(ctx, p.key)
	if err != nil {
		return policy.Document{}, fmt.Errorf("etcdstore: get policy: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return policy.Empty(), nil
	}
	return p.parse(resp.Kvs[0])
}

// parse returns the document stored in kv, or the *policy.Error.
func (p *policyStore) parse(kv *mvccpb.KeyValue) (policy.Document, error) {
	pol, err := policy.Parse(p.key, kv.Value)
	if err != nil {
		return policy.Document{}, err
	}
	return policy.Document{Policy: pol, Raw: kv.Value, Revision: kv.ModRevision}, nil
}

// Put implements policy.Store: it validates raw with policy.Parse and, only
// if it is valid, stores it as is (YAML or JSON, comments included).
func (p *policyStore) Put(ctx context.Context, raw []byte) (policy.Document, error) {
	if err := ctx.Err(); err != nil {
		return policy.Document{}, err
	}
	pol, err := policy.Parse("", raw)
	if err != nil {
		return policy.Document{}, err
	}
	if p.s.g.Closed() {
		return policy.Document{}, policy.ErrClosed
	}
	resp, err := p.s.client.Put(ctx, p.key, string(raw))
	if err != nil {
		return policy.Document{}, fmt.Errorf("etcdstore: put policy: %w", err)
	}
	return policy.Document{Policy: pol, Raw: append([]byte(nil), raw...), Revision: resp.Header.Revision}, nil
}

// Watch implements policy.Store. The first document is the one in force:
// the stored one, or, when the stored text is invalid, the newest valid
// version in etcd's history before it (the empty policy if there was none
// before the key was created). If etcd's history no longer has it, the
// first Next waits for the next valid document.
//
// Then every change is read in order: a valid document is delivered, an
// invalid one is logged and skipped (the previous stays in force), and a
// delete of the key puts the empty policy in force. A Watcher that falls
// behind delivers only the newest document. Broken watches resume and
// compacted ones re-read the key, as registry watches do.
func (p *policyStore) Watch(ctx context.Context) (policy.Watcher, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if p.s.g.Closed() {
		return nil, policy.ErrClosed
	}
	resp, err := p.s.client.Get(ctx, p.key)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: watch policy: %w", err)
	}
	w := p.newWatcher()
	if len(resp.Kvs) == 0 {
		w.publish(policy.Empty())
	} else {
		kv := resp.Kvs[0]
		w.keyRev = kv.ModRevision
		doc, err := p.parse(kv)
		if err != nil {
			p.s.log.Error("the stored policy document is invalid; looking for the previous valid one", "key", p.key, "revision", kv.ModRevision, "err", err)
			doc, err = p.lastValid(ctx, kv)
		}
		if err != nil {
			p.s.log.Error("no valid policy document found; waiting for one", "key", p.key, "err", err)
		} else {
			w.publish(doc)
		}
	}
	return p.startWatcher(w, resp.Header.Revision)
}

func (p *policyStore) newWatcher() *policyWatcher {
	w := &policyWatcher{p: p, wake: make(chan struct{})}
	w.start(p.s)
	return w
}

// startWatcher starts w's goroutine, watching from revision rev
// (exclusive).
func (p *policyStore) startWatcher(w *policyWatcher, rev int64) (*policyWatcher, error) {
	if !p.s.g.Go(func() { w.run(rev) }) {
		w.cancel()
		return nil, policy.ErrClosed
	}
	return w, nil
}

// lastValid walks back the history of the key from before kv and returns
// the newest valid document, or the empty policy if the key did not exist
// before kv's version of it.
func (p *policyStore) lastValid(ctx context.Context, kv *mvccpb.KeyValue) (policy.Document, error) {
	create := kv.CreateRevision
	for range maxHistory {
		rev := kv.ModRevision - 1
		if rev < create {
			return policy.Empty(), nil
		}
		resp, err := p.s.client.Get(ctx, p.key, clientv3.WithRev(rev))
		if err != nil {
			return policy.Document{}, fmt.Errorf("reading revision %d: %w", rev, err)
		}
		if len(resp.Kvs) == 0 {
			return policy.Empty(), nil
		}
		kv = resp.Kvs[0]
		if doc, err := p.parse(kv); err == nil {
			return doc, nil
		}
	}
	return policy.Document{}, fmt.Errorf("the last %d versions are invalid", maxHistory)
}

// policyWatcher is a policy.Watcher on etcd.
type policyWatcher struct {
	watchLife
	p      *policyStore
	keyRev int64 // owned by run after Watch: ModRevision of the last version seen, 0 when absent

	// guarded by mu:
	latest  policy.Document
	have    bool          // latest is set
	sent    bool          // Next has returned a document
	sentRev int64         // the revision of that document
	wake    chan struct{} // closed and replaced by publish
}

func (w *policyWatcher) publish(doc policy.Document) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.latest, w.have = doc, true
	close(w.wake)
	w.wake = make(chan struct{})
}

// Next implements policy.Watcher.
func (w *policyWatcher) Next(ctx context.Context) (policy.Document, error) {
	for {
		w.mu.Lock()
		if w.closed {
			w.mu.Unlock()
			return policy.Document{}, policy.ErrClosed
		}
		if w.have && (!w.sent || w.latest.Revision != w.sentRev) {
			w.sent, w.sentRev = true, w.latest.Revision
			doc := w.latest
			w.mu.Unlock()
			return doc, nil
		}
		wake := w.wake
		w.mu.Unlock()
		select {
		case <-wake:
		case <-w.done:
			return policy.Document{}, policy.ErrClosed
		case <-ctx.Done():
			return policy.Document{}, ctx.Err()
		}
	}
}

// apply takes one version of the key (nil: the key is absent) at revision
// rev.
func (w *policyWatcher) apply(kv *mvccpb.KeyValue, rev int64) {
	if kv == nil {
		if w.keyRev != 0 {
			w.keyRev = 0
			doc := policy.Empty()
			doc.Revision = rev
			w.publish(doc)
		}
		return
	}
	if kv.ModRevision == w.keyRev {
		return
	}
	w.keyRev = kv.ModRevision
	doc, err := w.p.parse(kv)
	if err != nil {
		w.p.s.log.Error("skipping an invalid policy document written to etcd; the previous one stays in force", "key", w.p.key, "revision", kv.ModRevision, "err", err)
		return
	}
	w.publish(doc)
}

// run follows the key from revision rev (exclusive) until the watcher is
// closed. It is the watcher's goroutine.
func (w *policyWatcher) run(rev int64) {
	defer close(w.done)
	s := w.p.s
	reread := func(ctx context.Context) (int64, error) {
		resp, err := s.client.Get(ctx, w.p.key)
		if err != nil {
			return 0, err
		}
		var kv *mvccpb.KeyValue
		if len(resp.Kvs) > 0 {
			kv = resp.Kvs[0]
		}
		w.apply(kv, resp.Header.Revision)
		return resp.Header.Revision, nil
	}
	s.follow(w.ctx, w.p.key, false, rev, false, reread, func(evs []*mvccpb.Event) bool {
		for _, ev := range evs {
			if ev.Type == mvccpb.DELETE {
				w.apply(nil, ev.Kv.ModRevision)
			} else {
				w.apply(ev.Kv, ev.Kv.ModRevision)
			}
		}
		return true
	})
}
