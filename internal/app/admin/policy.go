package admin

import (
	"context"
	"errors"
	"io"
	"net/http"

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
	if _, err := policy.Parse("", raw); err != nil {
		return policyError(err)
	}
	doc, err := s.store.Policy().Put(r.Context(), raw)
	if err != nil {
		if perr := policyError(err); perr != err {
			return perr
		}
		return etcdError("store policy", err)
	}
	s.log.Info("policy applied", "revision", doc.Revision, "bytes", len(raw))
	s.recordPolicy(r.Context(), doc.Revision, raw, p.String())
	writeJSON(w, http.StatusOK, adminapi.PolicyDocument{Revision: doc.Revision, Raw: string(doc.Raw), Policy: doc.Policy})
	return nil
}

func (s *Server) validatePolicy(w http.ResponseWriter, r *http.Request, _ *principal) error {
	raw, err := readDocument(r)
	if err != nil {
		return err
	}
	p, err := policy.Parse("", raw)
	if err != nil {
		return policyError(err)
	}
	writeJSON(w, http.StatusOK, adminapi.PolicyDocument{Raw: string(raw), Policy: p})
	return nil
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
