package policy

import (
	"context"
	"errors"
	"sync"
)

// Document is a stored policy: the validated policy, the text it was parsed
// from, and the store revision at which it was written.
type Document struct {
	Policy   *Policy
	Raw      []byte
	Revision int64
}

// Store keeps the one policy document in force and lets callers watch it.
//
// Put validates the document and refuses an invalid one as a whole; the
// previous document stays in force. A document that reaches the store by
// other means and fails validation is skipped by watchers, which keep the
// previous one (and say so in their logs).
type Store interface {
	// Get returns the document in force. With no document stored it returns
	// the empty policy at revision 0.
	Get(ctx context.Context) (Document, error)
	// Put validates raw (YAML or JSON) and stores it.
	Put(ctx context.Context, raw []byte) (Document, error)
	// Watch returns the document in force and then every valid change.
	Watch(ctx context.Context) (Watcher, error)
}

// Watcher streams policy documents.
type Watcher interface {
	// Next returns the next document: the first call returns the document in
	// force, later calls each newer valid document. It blocks until there is
	// one or ctx is done, and returns ErrClosed after Close.
	Next(ctx context.Context) (Document, error)
	Close() error
}

// ErrClosed is returned by a closed store or watcher.
var ErrClosed = errors.New("policy: closed")

// Empty is the document in force when none has been stored.
func Empty() Document { return Document{Policy: &Policy{}} }

// Memory is an in-process Store.
type Memory struct {
	mu   sync.Mutex
	doc  Document
	wake chan struct{} // closed and replaced on every Put
}

// NewMemory returns a store holding the empty policy.
func NewMemory() *Memory { return &Memory{doc: Empty(), wake: make(chan struct{})} }

var _ Store = (*Memory)(nil)

func (m *Memory) Get(ctx context.Context) (Document, error) {
	if err := ctx.Err(); err != nil {
		return Document{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.doc, nil
}

func (m *Memory) Put(ctx context.Context, raw []byte) (Document, error) {
	if err := ctx.Err(); err != nil {
		return Document{}, err
	}
	p, err := Parse("", raw)
	if err != nil {
		return Document{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.doc = Document{Policy: p, Raw: append([]byte(nil), raw...), Revision: m.doc.Revision + 1}
	close(m.wake)
	m.wake = make(chan struct{})
	return m.doc, nil
}

func (m *Memory) Watch(ctx context.Context) (Watcher, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return &memWatcher{m: m, last: -1, closed: make(chan struct{})}, nil
}

type memWatcher struct {
	m      *Memory
	last   int64
	once   sync.Once
	closed chan struct{}
}

func (w *memWatcher) Next(ctx context.Context) (Document, error) {
	for {
		select {
		case <-w.closed:
			return Document{}, ErrClosed
		default:
		}
		w.m.mu.Lock()
		doc, wake := w.m.doc, w.m.wake
		w.m.mu.Unlock()
		if doc.Revision != w.last {
			w.last = doc.Revision
			return doc, nil
		}
		select {
		case <-ctx.Done():
			return Document{}, ctx.Err()
		case <-w.closed:
			return Document{}, ErrClosed
		case <-wake:
		}
	}
}

func (w *memWatcher) Close() error {
	w.once.Do(func() { close(w.closed) })
	return nil
}
