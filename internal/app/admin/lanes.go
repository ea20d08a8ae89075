package admin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.yaml.in/yaml/v3"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/policy"
)

// lanes gathers every lane known from the policy, the instances and the
// claims.
func (s *Server) lanes(ctx context.Context) ([]adminapi.Lane, error) {
	insts, err := s.views(ctx, nil, "")
	if err != nil {
		return nil, err
	}
	claims, err := s.claims(ctx)
	if err != nil {
		return nil, err
	}
	pol := s.engine.Policy()
	now := s.now()
	byName := map[string]*adminapi.Lane{}
	get := func(n string) *adminapi.Lane {
		if l := byName[n]; l != nil {
			return l
		}
		l := &adminapi.Lane{Name: n, Services: []string{}}
		if set, ok := pol.Lanes[n]; ok {
			l.InPolicy = true
			l.Fallback, l.Strict, l.Clients = set.Fallback, set.Strict, set.Clients
			if set.Expires != nil {
				e := set.Expires.UTC()
				l.Expires = &e
				l.Expired = pol.Expired(n, now)
			}
		}
		byName[n] = l
		return l
	}
	for n := range pol.Lanes {
		get(n)
	}
	for _, in := range insts {
		if in.EffectiveLane == "" {
			continue
		}
		l := get(in.EffectiveLane)
		l.Instances++
		if !slices.Contains(l.Services, in.Service) {
			l.Services = append(l.Services, in.Service)
		}
	}
	for _, c := range claims {
		l := get(c.Lane)
		l.Claims = append(l.Claims, c.IP)
	}
	out := make([]adminapi.Lane, 0, len(byName))
	for _, l := range byName {
		sort.Strings(l.Services)
		sort.Strings(l.Claims)
		out = append(out, *l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (s *Server) listLanes(w http.ResponseWriter, r *http.Request, _ *principal) error {
	out, err := s.lanes(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"lanes": out})
	return nil
}

func pathLane(r *http.Request) (string, error) {
	v := r.PathValue("lane")
	l, err := lane.Parse(v)
	if err != nil {
		return "", badRequest("lane", v, "%v", err)
	}
	return l, nil
}

func (s *Server) lane(ctx context.Context, name string) (adminapi.Lane, error) {
	all, err := s.lanes(ctx)
	if err != nil {
		return adminapi.Lane{}, err
	}
	for _, l := range all {
		if l.Name == name {
			return l, nil
		}
	}
	return adminapi.Lane{Name: name, Services: []string{}}, nil
}

func (s *Server) getLane(w http.ResponseWriter, r *http.Request, _ *principal) error {
	name, err := pathLane(r)
	if err != nil {
		return err
	}
	l, err := s.lane(r.Context(), name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, l)
	return nil
}

// putLane sets or clears lanes.<lane>.expires in the stored policy document,
// keeping the rest of the document (comments included) as it is.
func (s *Server) putLane(w http.ResponseWriter, r *http.Request, p *principal) error {
	name, err := pathLane(r)
	if err != nil {
		return err
	}
	var u adminapi.LaneUpdate
	if err := decode(r, &u); err != nil {
		return err
	}
	set := 0
	for _, b := range []bool{u.Expires != nil, u.ExpiresIn != 0, u.NoExpiry} {
		if b {
			set++
		}
	}
	if set != 1 {
		return badRequest("expires", "", "set exactly one of expires (an RFC 3339 time), expires_in (a duration) and no_expiry")
	}
	var exp *time.Time
	switch {
	case u.Expires != nil:
		t := u.Expires.UTC().Truncate(time.Second)
		exp = &t
	case u.ExpiresIn != 0:
		if u.ExpiresIn < 0 {
			return badRequest("expires_in", u.ExpiresIn.String(), "expires_in must be positive")
		}
		t := s.now().Add(u.ExpiresIn.D()).UTC().Truncate(time.Second)
		if t.Before(s.now().Add(u.ExpiresIn.D())) {
			t = t.Add(time.Second) // never earlier than asked
		}
		exp = &t
	}
	ctx := r.Context()
	rev, updated, err := s.editPolicy(ctx, func(raw []byte, now *policy.Policy) ([]byte, error) {
		if now == nil {
			_, perr := policy.Parse(s.store.PolicyKey(), raw)
			return nil, &apiError{status: http.StatusConflict, body: adminapi.Error{Code: adminapi.CodeInvalidPolicy,
				Message: "the stored policy document is invalid; apply a valid one first: " + perr.Error()}}
		}
		updated, err := setLaneExpiry(raw, name, exp)
		if err != nil {
			return nil, errorf(http.StatusConflict, adminapi.CodeInvalidPolicy, "lanes", "", "cannot edit the stored policy document: %v", err)
		}
		return updated, nil
	})
	if err != nil {
		return err
	}
	s.log.Info("lane expiry set", "lane", name, "expires", exp, "revision", rev)
	s.recordPolicy(ctx, rev, updated, p.String())
	l, err := s.lane(ctx, name)
	if err != nil {
		return err
	}
	// The engine follows the store a moment later; answer with the
	// settings just written.
	l.InPolicy = true
	l.Expires, l.Expired = exp, exp != nil && !s.now().Before(*exp)
	writeJSON(w, http.StatusOK, l)
	return nil
}

// editPolicy replaces the stored policy document with edit's answer, which
// must be a valid document: edit receives the stored text and its policy
// (nil when the stored text is invalid, written by other means). It writes
// only if the document did not change meanwhile, and edits the newer one
// otherwise. It returns the revision and the text written.
func (s *Server) editPolicy(ctx context.Context, edit func(raw []byte, now *policy.Policy) ([]byte, error)) (int64, []byte, error) {
	key := s.store.PolicyKey()
	for range 10 {
		resp, err := s.cli.Get(ctx, key)
		if err != nil {
			return 0, nil, etcdError("read policy", err)
		}
		var raw []byte
		var rev int64
		if len(resp.Kvs) == 1 {
			raw, rev = resp.Kvs[0].Value, resp.Kvs[0].ModRevision
		}
		now, err := policy.Parse(key, raw)
		if err != nil {
			now = nil
		}
		updated, err := edit(raw, now)
		if err != nil {
			return 0, nil, err
		}
		if _, err := policy.Parse("", updated); err != nil {
			return 0, nil, policyError(err)
		}
		txn, err := s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, string(updated))).
			Commit()
		if err != nil {
			return 0, nil, etcdError("store policy", err)
		}
		if txn.Succeeded {
			return txn.Header.Revision, updated, nil
		}
		// changed meanwhile: edit the new one
	}
	return 0, nil, conflict("", "", "the policy keeps changing; try again")
}

// setLaneExpiry returns the document raw with lanes.<name>.expires set to
// exp, or removed when exp is nil (with the lane's entry, if nothing else is
// left in it). The rest of the document is kept, comments included; a JSON
// document comes back as flow-style YAML.
func setLaneExpiry(raw []byte, name string, exp *time.Time) ([]byte, error) {
	var doc yaml.Node
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := yaml.Unmarshal(raw, &doc); err != nil {
			return nil, err
		}
	}
	if doc.Kind == 0 {
		doc = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode}}}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, errors.New("not a single YAML document")
	}
	root := doc.Content[0]
	if isNull(root) {
		*root = yaml.Node{Kind: yaml.MappingNode}
	}
	if root.Kind != yaml.MappingNode {
		return nil, errors.New("the document is not a mapping")
	}
	lanes := mapValue(root, func(k string) bool { return k == "lanes" })
	if lanes == nil {
		if exp == nil {
			return raw, nil
		}
		lanes = mapAdd(root, "lanes")
	}
	if isNull(lanes) {
		*lanes = yaml.Node{Kind: yaml.MappingNode}
	}
	if lanes.Kind != yaml.MappingNode {
		return nil, errors.New("lanes is not a mapping")
	}
	ln := mapValue(lanes, func(k string) bool { n, ok := lane.Normalize(k); return ok && n == name })
	if ln == nil {
		if exp == nil {
			return raw, nil
		}
		ln = mapAdd(lanes, name)
	}
	if isNull(ln) {
		*ln = yaml.Node{Kind: yaml.MappingNode}
	}
	if ln.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("lanes.%s is not a mapping", name)
	}
	if exp != nil {
		v := mapValue(ln, func(k string) bool { return k == "expires" })
		if v == nil {
			v = mapAdd(ln, "expires")
		}
		*v = yaml.Node{Kind: yaml.ScalarNode, Value: exp.UTC().Format(time.RFC3339)}
	} else {
		mapDelete(ln, "expires")
		if len(ln.Content) == 0 {
			mapDeleteFunc(lanes, func(k string) bool { n, ok := lane.Normalize(k); return ok && n == name })
		}
		if len(lanes.Content) == 0 {
			mapDelete(root, "lanes")
		}
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && (n.Tag == "!!null" || n.Value == "" && n.Tag == "")
}

func mapValue(m *yaml.Node, match func(string) bool) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if match(m.Content[i].Value) {
			return m.Content[i+1]
		}
	}
	return nil
}

func mapAdd(m *yaml.Node, key string) *yaml.Node {
	v := &yaml.Node{Kind: yaml.MappingNode}
	if m.Style&yaml.FlowStyle != 0 {
		v.Style = yaml.FlowStyle
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v)
	return v
}

func mapDelete(m *yaml.Node, key string) {
	mapDeleteFunc(m, func(k string) bool { return k == key })
}

func mapDeleteFunc(m *yaml.Node, match func(string) bool) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if match(m.Content[i].Value) {
			m.Content = append(m.Content[:i], m.Content[i+2:]...)
			return
		}
	}
}
