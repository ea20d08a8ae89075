package adminclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

// WatchPolicy opens the stream of the policy in force (GET
// /v1/watch/policy): the document in force, then every change. Most callers
// use Registry.Policy, whose watcher the routing engine follows.
func (c *Client) WatchPolicy(ctx context.Context) (*PolicyStream, error) {
	resp, err := c.send(ctx, http.MethodGet, "/v1/watch/policy", nil, nil, "")
	if err != nil {
		return nil, err
	}
	return &PolicyStream{body: resp.Body, dec: json.NewDecoder(resp.Body), last: -1}, nil
}

// PolicyStream reads the documents of a policy watch. Cancelling the
// context given to WatchPolicy, or Close, ends it.
type PolicyStream struct {
	body io.ReadCloser
	dec  *json.Decoder
	last int64
}

// Next blocks until a document newer than the last one arrives; it skips
// the server's keep-alives, which repeat the revision in force.
func (s *PolicyStream) Next() (adminapi.PolicyDocument, error) {
	for {
		var d adminapi.PolicyDocument
		if err := s.dec.Decode(&d); err != nil {
			return adminapi.PolicyDocument{}, err
		}
		if d.Revision <= s.last {
			continue
		}
		s.last = d.Revision
		return d, nil
	}
}

// Close ends the stream.
func (s *PolicyStream) Close() error { return s.body.Close() }

// Policy returns the policy store of the control plane, as seen through
// the admin API, so that a process that registers with a token follows
// fallback chains, strict lanes, tag rules and canaries like any other:
//
//	engine := routing.New(routing.WithRegistry(reg), routing.WithPolicyStore(reg.Policy()))
//
// Get and Watch need any valid token; Put needs the admin token. Each
// document is parsed again here, with the same rules as the control plane.
func (r *Registry) Policy() policy.Store { return &policyStore{r: r} }

type policyStore struct{ r *Registry }

func (p *policyStore) Get(ctx context.Context) (policy.Document, error) {
	d, err := p.r.c.Policy(ctx)
	if err != nil {
		return policy.Document{}, err
	}
	return toDocument(d)
}

func (p *policyStore) Put(ctx context.Context, raw []byte) (policy.Document, error) {
	if _, err := policy.Parse("", raw); err != nil {
		return policy.Document{}, err
	}
	d, err := p.r.c.PutPolicy(ctx, raw)
	if err != nil {
		return policy.Document{}, err
	}
	return toDocument(d)
}

// toDocument parses the raw text of a document again, so that the policy in
// force here is what this version of lanes makes of it.
func toDocument(d adminapi.PolicyDocument) (policy.Document, error) {
	if d.Raw == "" {
		doc := policy.Empty()
		doc.Revision = d.Revision
		return doc, nil
	}
	pol, err := policy.Parse("", []byte(d.Raw))
	if err != nil {
		return policy.Document{}, fmt.Errorf("adminclient: policy at revision %d: %w", d.Revision, err)
	}
	return policy.Document{Policy: pol, Raw: []byte(d.Raw), Revision: d.Revision}, nil
}

// Watch opens the stream in the call, so that an unreachable control plane
// or a refused token is returned here. The watcher ends (Next returns an
// error) when the stream breaks; the routing engine then watches again.
func (p *policyStore) Watch(ctx context.Context) (policy.Watcher, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r := p.r
	w := &policyWatcher{log: r.log, docs: make(chan policy.Document), done: make(chan struct{})}
	err := openStream(ctx, r, r.c.WatchPolicy, func(ctx context.Context, cancel context.CancelFunc) func(*PolicyStream) {
		w.ctx, w.cancel = ctx, cancel
		return w.run
	})
	if errors.Is(err, registry.ErrClosed) {
		return nil, policy.ErrClosed
	}
	if err != nil {
		return nil, err
	}
	return w, nil
}

type policyWatcher struct {
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	docs   chan policy.Document
	done   chan struct{} // closed when run returns
	err    error         // why the stream ended; set before done is closed
	once   sync.Once
}

func (w *policyWatcher) run(s *PolicyStream) {
	defer close(w.done)
	defer s.Close()
	for {
		d, err := s.Next()
		if err == nil {
			doc, perr := toDocument(d)
			if perr != nil {
				w.log.Error("skipping a policy document this version cannot read; the previous one stays in force", "revision", d.Revision, "err", perr)
				continue
			}
			select {
			case w.docs <- doc:
				continue
			case <-w.ctx.Done():
				err = w.ctx.Err()
			}
		}
		w.err = fmt.Errorf("adminclient: policy watch ended: %w", err)
		return
	}
}

func (w *policyWatcher) Next(ctx context.Context) (policy.Document, error) {
	select {
	case doc := <-w.docs:
		return doc, nil
	case <-ctx.Done():
		return policy.Document{}, ctx.Err()
	case <-w.done:
		if w.ctx.Err() != nil {
			return policy.Document{}, policy.ErrClosed
		}
		return policy.Document{}, w.err
	}
}

func (w *policyWatcher) Close() error {
	w.once.Do(func() {
		w.cancel()
		<-w.done
	})
	return nil
}
