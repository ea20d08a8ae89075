package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/policy"
)

// readDocument reads a policy document body (YAML or JSON, as is).
func readDocument(r *http.Request) ([]byte, error) {
	data, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, policy.MaxSize))
	if err != nil {
		var me *http.MaxBytesError
		if errors.As(err, &me) {
			return nil, errorf(http.StatusRequestEntityTooLarge, adminapi.CodeBadRequest, "", "", "the document is larger than %d bytes (1 MiB), the most a policy may have", policy.MaxSize)
		}
		return nil, badRequest("", "", "read the document: %v", err)
	}
	return data, nil
}

// policyError turns a refusal of policy.Parse into a 422 naming the line
// and the field.
func policyError(err error) error {
	var pe *policy.Error
	if errors.As(err, &pe) {
		return &apiError{status: http.StatusUnprocessableEntity, body: adminapi.Error{
			Code: adminapi.CodeInvalidPolicy, Message: pe.Msg, Field: pe.Field, Line: pe.Line,
		}}
	}
	return err
}

func (s *Server) getPolicy(w http.ResponseWriter, r *http.Request, _ *principal) error {
	doc, err := s.store.Policy().Get(r.Context())
	if err != nil {
		var pe *policy.Error
		if errors.As(err, &pe) {
			// Written into etcd by other means; the engine keeps the
			// previous valid document.
			return &apiError{status: http.StatusConflict, body: adminapi.Error{Code: adminapi.CodeInvalidPolicy,
				Message: "the stored policy document is invalid (written by other means than the API): " + err.Error(), Field: pe.Field, Line: pe.Line}}
		}
		return etcdError("read policy", err)
	}
	writeJSON(w, http.StatusOK, adminapi.PolicyDocument{Revision: doc.Revision, Raw: string(doc.Raw), Policy: doc.Policy})
	return nil
}

func (s *Server) putPolicy(w http.ResponseWriter, r *http.Request, p *principal) error {
	raw, err := readDocument(r)
	if err != nil {
		return err
	}
	doc, err := s.applyPolicy(r.Context(), raw, p.String())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, doc)
	return nil
}

// applyPolicy validates raw and stores it as the policy in force, keeping
// the lane lifetimes in force that it does not set, and records it in the
// history as applied by who.
func (s *Server) applyPolicy(ctx context.Context, raw []byte, who string) (adminapi.PolicyDocument, error) {
	if _, err := policy.Parse("", raw); err != nil {
		return adminapi.PolicyDocument{}, policyError(err)
	}
	var kept []adminapi.KeptLifetime
	rev, stored, err := s.editPolicy(ctx, func(_ []byte, now *policy.Policy) ([]byte, error) {
		merged, k, err := keepLifetimes(now, raw)
		kept = k
		return merged, err
	})
	if err != nil {
		return adminapi.PolicyDocument{}, err
	}
	pol, err := policy.Parse("", stored)
	if err != nil {
		return adminapi.PolicyDocument{}, policyError(err)
	}
	s.log.Info("policy applied", "revision", rev, "bytes", len(stored), "kept_lifetimes", len(kept), "by", who)
	s.recordPolicy(ctx, rev, stored, who)
	return adminapi.PolicyDocument{Revision: rev, Raw: string(stored), Policy: pol, Kept: kept}, nil
}

// ApplyPolicy applies a policy document as PUT /v1/policy does (the same
// validation, lifetimes kept, history), unless the policy in force is
// already what it would store: then it answers the policy in force and
// writes nothing, so that a controller may call it on every reconcile. who
// names the applier in the history. A refusal is an *adminapi.Error that
// names the field.
func (s *Server) ApplyPolicy(ctx context.Context, raw []byte, who string) (adminapi.PolicyDocument, error) {
	if len(raw) > policy.MaxSize {
		return adminapi.PolicyDocument{}, &adminapi.Error{Status: http.StatusRequestEntityTooLarge, Code: adminapi.CodeBadRequest,
			Message: fmt.Sprintf("the document is larger than %d bytes (1 MiB), the most a policy may have", policy.MaxSize)}
	}
	merged, err := s.mergedPolicy(ctx, raw)
	if err != nil {
		return adminapi.PolicyDocument{}, apiErr(err)
	}
	now, err := s.store.Policy().Get(ctx)
	if err == nil && string(now.Raw) == string(merged.Raw) {
		return adminapi.PolicyDocument{Revision: now.Revision, Raw: string(now.Raw), Policy: now.Policy}, nil
	}
	doc, err := s.applyPolicy(ctx, raw, who)
	return doc, apiErr(err)
}

// apiErr turns an answer of the API into the *adminapi.Error a client
// would have read.
func apiErr(err error) error {
	var ae *apiError
	if errors.As(err, &ae) {
		e := ae.body
		e.Status = ae.status
		return &e
	}
	return err
}

// validatePolicy checks a document and answers with it as applying it
// would store it (the lane lifetimes in force that it does not set kept),
// so that a dry run shows every change an apply makes.
func (s *Server) validatePolicy(w http.ResponseWriter, r *http.Request, _ *principal) error {
	raw, err := readDocument(r)
	if err != nil {
		return err
	}
	doc, err := s.mergedPolicy(r.Context(), raw)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, doc)
	return nil
}

// mergedPolicy validates raw and returns it as applying it would store it.
func (s *Server) mergedPolicy(ctx context.Context, raw []byte) (adminapi.PolicyDocument, error) {
	if _, err := policy.Parse("", raw); err != nil {
		return adminapi.PolicyDocument{}, policyError(err)
	}
	now, err := s.store.Policy().Get(ctx)
	var pe *policy.Error
	switch {
	case errors.As(err, &pe):
		now = policy.Empty() // invalid in etcd: an apply replaces it as a whole
	case err != nil:
		return adminapi.PolicyDocument{}, etcdError("read policy", err)
	}
	merged, kept, err := keepLifetimes(now.Policy, raw)
	if err != nil {
		return adminapi.PolicyDocument{}, err
	}
	p, err := policy.Parse("", merged)
	if err != nil {
		return adminapi.PolicyDocument{}, policyError(err)
	}
	return adminapi.PolicyDocument{Raw: string(merged), Policy: p, Kept: kept}, nil
}

// keepLifetimes returns the document raw with every lane lifetime of the
// policy in force (now) that raw does not set added to it, and the
// lifetimes it added. A lifetime is the operators' decision to end a lane
// (`lanes lane expire`): a document kept elsewhere that predates it must
// not lift it unnoticed. A document that sets a lane's expires sets it;
// `lanes lane expire LANE --never` lifts one.
func keepLifetimes(now *policy.Policy, raw []byte) ([]byte, []adminapi.KeptLifetime, error) {
	if now == nil {
		return raw, nil, nil
	}
	next, err := policy.Parse("", raw)
	if err != nil {
		return nil, nil, policyError(err)
	}
	var kept []adminapi.KeptLifetime
	for _, name := range slices.Sorted(maps.Keys(now.Lanes)) {
		e := now.Lanes[name].Expires
		if e == nil || next.Lanes[name].Expires != nil {
			continue
		}
		if raw, err = setLaneExpiry(raw, name, e); err != nil {
			return nil, nil, errorf(http.StatusUnprocessableEntity, adminapi.CodeInvalidPolicy, "lanes", "",
				"cannot keep the lifetime of lane %s (expires %s) in the document: %v; set lanes.%s.expires in it, or lift the lifetime with lanes lane expire %s --never",
				name, e.UTC().Format(time.RFC3339), err, name, name)
		}
		kept = append(kept, adminapi.KeptLifetime{Lane: name, Expires: e.UTC()})
	}
	return raw, kept, nil
}

// watchPolicy streams the policy in force, then every change, as
// newline-delimited PolicyDocuments. An idle stream repeats the revision
// in force now and then ({"revision": N, "keepalive": true}), which
// clients skip, so that proxies keep the connection open.
func (s *Server) watchPolicy(w http.ResponseWriter, r *http.Request, _ *principal) error {
	var rev int64
	return serveStream(s, w, r, "watch policy",
		func(ctx context.Context) (watcher[policy.Document], error) { return s.store.Policy().Watch(ctx) },
		func(doc policy.Document) any {
			rev = doc.Revision
			return adminapi.PolicyDocument{Revision: doc.Revision, Raw: string(doc.Raw), Policy: doc.Policy}
		},
		func() any {
			return struct {
				Revision  int64 `json:"revision"`
				KeepAlive bool  `json:"keepalive"`
			}{rev, true}
		})
}
