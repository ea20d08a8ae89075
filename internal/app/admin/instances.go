package admin

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

// MaxTTL bounds the TTL of a registration through the API.
const MaxTTL = time.Hour

// A registration through the API is an etcd lease granted by the control
// plane, with the instance key (<prefix>instances/<service>/<id>, as
// etcdstore writes it) attached. Its id, on the wire, is the lease id in hex.
// Heartbeats renew the lease; deregistering revokes it, which deletes the
// instance and any claim attached to the same lease.

func (s *Server) instanceKey(service, id string) string {
	return s.store.InstanceKey(service, id)
}

func formatLease(id clientv3.LeaseID) string { return strconv.FormatInt(int64(id), 16) }

func parseLease(v string) (clientv3.LeaseID, error) {
	n, err := strconv.ParseInt(v, 16, 64)
	if err != nil || n <= 0 {
		return 0, badRequest("registration", v, "not a registration id (a lease id in hex)")
	}
	return clientv3.LeaseID(n), nil
}

// policyNow returns the stored policy, read from etcd so that a lane expiry
// set a moment ago counts; the engine's copy if the stored one is unreadable.
func (s *Server) policyNow(ctx context.Context) *policy.Policy {
	doc, err := s.store.Policy().Get(ctx)
	if err != nil || doc.Policy == nil {
		return s.engine.Policy()
	}
	return doc.Policy
}

func (s *Server) refuseExpired(ctx context.Context, field, l string) error {
	if l == "" {
		return nil
	}
	if p := s.policyNow(ctx); p.Expired(l, s.now()) {
		return errorf(http.StatusForbidden, adminapi.CodeLaneExpired, field, l,
			"lane %q expired at %s; it takes no new registrations", l, p.Lanes[l].Expires.UTC().Format(time.RFC3339))
	}
	return nil
}

func fieldError(prefix string, err error) error {
	var fe *registry.FieldError
	if errors.As(err, &fe) {
		return badRequest(prefix+fe.Field, fe.Value, "%s: %q: %s", prefix+fe.Field, fe.Value, fe.Msg)
	}
	return badRequest("", "", "%v", err)
}

func scopeError(p *principal, l string) error {
	target := "the baseline"
	if l != "" {
		target = "lane " + strconv.Quote(l)
	}
	return forbidden("instance.lane", l, "%s cannot register into %s: a token registers only into its own lane, and the baseline needs a baseline token", p, target)
}

func (s *Server) register(w http.ResponseWriter, r *http.Request, p *principal) error {
	var req adminapi.RegisterRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	ttl := req.TTL.D()
	switch {
	case ttl == 0:
		ttl = registry.DefaultTTL
	case ttl < time.Second || ttl > MaxTTL:
		return badRequest("ttl", req.TTL.String(), "ttl must be within 1s..%s", MaxTTL)
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	inst, err := registry.Normalize(req.Instance)
	if err != nil {
		return fieldError("instance.", err)
	}
	if !p.allows(inst.Lane) {
		s.metrics.registrations.WithLabelValues("refused").Inc()
		return scopeError(p, inst.Lane)
	}
	if err := s.refuseExpired(r.Context(), "instance.lane", inst.Lane); err != nil {
		s.metrics.registrations.WithLabelValues("refused").Inc()
		return err
	}
	val, _ := json.Marshal(inst)
	key := s.instanceKey(inst.Service, inst.ID)
	ctx := r.Context()

	if req.Registration != "" {
		// An update under the same registration, if it still holds the key.
		id, err := parseLease(req.Registration)
		if err != nil {
			return err
		}
		resp, err := s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.LeaseValue(key), "=", id)).
			Then(clientv3.OpPut(key, string(val), clientv3.WithLease(id))).
			Commit()
		if err != nil {
			return etcdError("update instance", err)
		}
		result := "updated"
		if !resp.Succeeded {
			result = "replaced"
		}
		s.metrics.registrations.WithLabelValues(result).Inc()
		writeJSON(w, http.StatusOK, adminapi.Registration{Instance: inst, Registration: req.Registration, TTL: adminapi.Duration(time.Duration(secs) * time.Second), Held: resp.Succeeded})
		return nil
	}

	for range 5 {
		cur, err := s.cli.Get(ctx, key)
		if err != nil {
			return etcdError("read instance", err)
		}
		cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
		if len(cur.Kvs) == 1 {
			kv := cur.Kvs[0]
			if req.IfAbsent {
				s.metrics.registrations.WithLabelValues("replaced").Inc()
				return conflict("instance.id", inst.ID, "instance %s/%s is held by another registration", inst.Service, inst.ID)
			}
			var old registry.Instance
			if json.Unmarshal(kv.Value, &old) == nil && old.Lane != inst.Lane {
				s.metrics.registrations.WithLabelValues("refused").Inc()
				return conflict("instance.id", inst.ID, "instance id %s/%s is registered in %s; it cannot be taken over from %s", inst.Service, inst.ID, laneName(old.Lane), laneName(inst.Lane))
			}
			cmp = clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)
		}
		g, err := s.cli.Grant(ctx, secs)
		if err != nil {
			return etcdError("grant lease", err)
		}
		resp, err := s.cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, string(val), clientv3.WithLease(g.ID))).Commit()
		if err != nil || !resp.Succeeded {
			s.revoke(g.ID)
			if err != nil {
				return etcdError("register instance", err)
			}
			continue // changed meanwhile: look again
		}
		s.metrics.registrations.WithLabelValues("created").Inc()
		s.log.Info("instance registered", "service", inst.Service, "id", inst.ID, "lane", inst.Lane, "addr", inst.Addr, "registration", formatLease(g.ID), "by", p.String())
		writeJSON(w, http.StatusCreated, adminapi.Registration{Instance: inst, Registration: formatLease(g.ID), TTL: adminapi.Duration(time.Duration(g.TTL) * time.Second), Held: true})
		return nil
	}
	return conflict("instance.id", inst.ID, "instance %s/%s keeps changing; try again", inst.Service, inst.ID)
}

func laneName(l string) string {
	if l == "" {
		return "the baseline"
	}
	return "lane " + strconv.Quote(l)
}

// revoke revokes a lease, best effort, bounded.
func (s *Server) revoke(id clientv3.LeaseID) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := s.cli.Revoke(ctx, id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil
	}
	return err
}

// authorizeLease checks that p may act on lease id: every instance and claim
// attached to it must be in a lane p is allowed. It fails with 404 when the
// lease does not exist.
func (s *Server) authorizeLease(ctx context.Context, p *principal, id clientv3.LeaseID) error {
	ttl, err := s.cli.TimeToLive(ctx, id, clientv3.WithAttachedKeys())
	if errors.Is(err, rpctypes.ErrLeaseNotFound) || err == nil && ttl.TTL <= 0 {
		return notFound("registration", formatLease(id), "registration %s has expired or was never made", formatLease(id))
	}
	if err != nil {
		return etcdError("read registration", err)
	}
	if p.admin {
		return nil
	}
	for _, k := range ttl.Keys {
		l, ok, err := s.laneOfKey(ctx, string(k))
		if err != nil {
			return err
		}
		if ok && !p.allows(l) {
			return forbidden("registration", formatLease(id), "%s cannot act on registration %s, which holds %s in %s", p, formatLease(id), strings.TrimPrefix(string(k), s.prefix), laneName(l))
		}
	}
	return nil
}

// laneOfKey returns the lane of the instance or claim stored at key.
func (s *Server) laneOfKey(ctx context.Context, key string) (string, bool, error) {
	if !strings.HasPrefix(key, s.store.InstancesPrefix()) && !strings.HasPrefix(key, s.prefix+"claims/") {
		return "", false, nil
	}
	resp, err := s.cli.Get(ctx, key)
	if err != nil {
		return "", false, etcdError("read key", err)
	}
	if len(resp.Kvs) == 0 {
		return "", false, nil
	}
	var v struct {
		Lane string `json:"lane"`
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &v); err != nil {
		return "", false, nil
	}
	return v.Lane, true, nil
}

func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request, p *principal) error {
	var req adminapi.HeartbeatRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	id, err := parseLease(req.Registration)
	if err != nil {
		return err
	}
	ctx := r.Context()
	key := s.instanceKey(r.PathValue("service"), r.PathValue("id"))
	cur, err := s.cli.Get(ctx, key)
	if err != nil {
		return etcdError("read instance", err)
	}
	var inst registry.Instance
	held := len(cur.Kvs) == 1 && clientv3.LeaseID(cur.Kvs[0].Lease) == id
	if held {
		if err := json.Unmarshal(cur.Kvs[0].Value, &inst); err != nil {
			return errorf(http.StatusInternalServerError, adminapi.CodeInternal, "", "", "unreadable instance at %s: %v", key, err)
		}
		if !p.allows(inst.Lane) {
			s.metrics.heartbeats.WithLabelValues("refused").Inc()
			return forbidden("registration", req.Registration, "%s cannot renew an instance of %s", p, laneName(inst.Lane))
		}
		// The engine's copy of the policy follows etcd within moments;
		// heartbeats are frequent, so they do not read etcd for it.
		if pol := s.engine.Policy(); pol.Expired(inst.Lane, s.now()) {
			s.revoke(id)
			s.metrics.heartbeats.WithLabelValues("lane_expired").Inc()
			s.log.Info("registration ended: its lane has expired", "service", inst.Service, "id", inst.ID, "lane", inst.Lane)
			return errorf(http.StatusGone, adminapi.CodeLaneExpired, "instance.lane", inst.Lane, "lane %q has expired; registration %s is ended", inst.Lane, req.Registration)
		}
	} else if err := s.authorizeLease(ctx, p, id); err != nil {
		if ae, ok := err.(*apiError); ok && ae.status == http.StatusNotFound {
			s.metrics.heartbeats.WithLabelValues("expired").Inc()
		}
		return err
	}
	ka, err := s.cli.KeepAliveOnce(ctx, id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		s.metrics.heartbeats.WithLabelValues("expired").Inc()
		return notFound("registration", req.Registration, "registration %s has expired; register again", req.Registration)
	}
	if err != nil {
		return etcdError("renew registration", err)
	}
	s.metrics.heartbeats.WithLabelValues("ok").Inc()
	writeJSON(w, http.StatusOK, adminapi.Registration{Instance: inst, Registration: req.Registration, TTL: adminapi.Duration(time.Duration(ka.TTL) * time.Second), Held: held})
	return nil
}

func (s *Server) deregister(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	service, iid := r.PathValue("service"), r.PathValue("id")
	key := s.instanceKey(service, iid)
	cur, err := s.cli.Get(ctx, key)
	if err != nil {
		return etcdError("read instance", err)
	}
	reg := r.URL.Query().Get("registration")
	if reg == "" {
		// Removal by the admin, whatever holds it.
		if !p.admin {
			return badRequest("registration", "", "name the registration to end (?registration=<id>); only the admin token removes an instance without it")
		}
		if len(cur.Kvs) == 0 {
			return notFound("id", iid, "no instance %s/%s", service, iid)
		}
		if l := clientv3.LeaseID(cur.Kvs[0].Lease); l != 0 {
			s.revoke(l)
		}
		if _, err := s.cli.Delete(ctx, key); err != nil {
			return etcdError("delete instance", err)
		}
		s.log.Info("instance removed by the admin", "service", service, "id", iid)
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	id, err := parseLease(reg)
	if err != nil {
		return err
	}
	if len(cur.Kvs) == 1 && clientv3.LeaseID(cur.Kvs[0].Lease) == id {
		var inst registry.Instance
		json.Unmarshal(cur.Kvs[0].Value, &inst)
		if !p.allows(inst.Lane) {
			return forbidden("registration", reg, "%s cannot deregister an instance of %s", p, laneName(inst.Lane))
		}
	}
	if err := s.authorizeLease(ctx, p, id); err != nil {
		return err
	}
	if _, err := s.cli.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return etcdError("end registration", err)
	}
	s.log.Info("instance deregistered", "service", service, "id", iid, "registration", reg)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// list returns every instance of service (of all when ""), read from etcd.
func (s *Server) list(ctx context.Context, service string) ([]*mvccpb.KeyValue, []registry.Instance, error) {
	pfx := s.store.InstancesPrefix()
	if service != "" {
		pfx += service + "/"
	}
	resp, err := s.cli.Get(ctx, pfx, clientv3.WithPrefix())
	if err != nil {
		return nil, nil, etcdError("list instances", err)
	}
	var kvs []*mvccpb.KeyValue
	var out []registry.Instance
	for _, kv := range resp.Kvs {
		var in registry.Instance
		if err := json.Unmarshal(kv.Value, &in); err != nil {
			continue
		}
		in, err := registry.Normalize(in)
		if err != nil || s.instanceKey(in.Service, in.ID) != string(kv.Key) {
			continue // etcdstore logs and ignores such values too
		}
		kvs = append(kvs, kv)
		out = append(out, in)
	}
	return kvs, out, nil
}

// views returns the instances as the API shows them.
func (s *Server) views(ctx context.Context, service string) ([]adminapi.Instance, error) {
	kvs, insts, err := s.list(ctx, service)
	if err != nil {
		return nil, err
	}
	pol := s.engine.Policy()
	now := s.now()
	out := make([]adminapi.Instance, 0, len(insts))
	for i, in := range insts {
		v := adminapi.Instance{Instance: in, EffectiveLane: s.engine.LaneOf(in), State: "ready"}
		switch {
		case pol.Expired(v.EffectiveLane, now):
			v.State = "expired"
		case in.EffectiveWeight() == 0:
			v.State = "drained"
		}
		if kvs[i].Lease != 0 {
			v.Registration = formatLease(clientv3.LeaseID(kvs[i].Lease))
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Service != b.Service {
			return a.Service < b.Service
		}
		if a.EffectiveLane != b.EffectiveLane {
			return a.EffectiveLane < b.EffectiveLane
		}
		return a.ID < b.ID
	})
	return out, nil
}

func (s *Server) listInstances(w http.ResponseWriter, r *http.Request, _ *principal) error {
	svc := r.URL.Query().Get("service")
	if svc != "" {
		if err := registry.CheckService(svc); err != nil {
			return fieldError("", err)
		}
	}
	out, err := s.views(r.Context(), svc)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"instances": out})
	return nil
}

func (s *Server) listServices(w http.ResponseWriter, r *http.Request, _ *principal) error {
	insts, err := s.views(r.Context(), "")
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"services": services(insts)})
	return nil
}

func services(insts []adminapi.Instance) []adminapi.Service {
	out := []adminapi.Service{}
	for _, in := range insts { // sorted by service, then lane
		if len(out) == 0 || out[len(out)-1].Name != in.Service {
			out = append(out, adminapi.Service{Name: in.Service, Lanes: []string{}})
		}
		sv := &out[len(out)-1]
		sv.Instances++
		if n := len(sv.Lanes); n == 0 || sv.Lanes[n-1] != in.EffectiveLane {
			sv.Lanes = append(sv.Lanes, in.EffectiveLane)
		}
	}
	return out
}

// keepAliveEvery is how often an idle watch stream sends an empty batch.
var keepAliveEvery = 15 * time.Second

func (s *Server) watchInstances(w http.ResponseWriter, r *http.Request, _ *principal) error {
	svc := r.URL.Query().Get("service")
	if svc != "" {
		if err := registry.CheckService(svc); err != nil {
			return fieldError("", err)
		}
	}
	if !s.beginStream() {
		return errorf(http.StatusServiceUnavailable, adminapi.CodeUnavailable, "", "", "the control plane is shutting down")
	}
	defer s.wg.Done()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(s.streams, cancel)
	defer stop()
	wt, err := s.store.Watch(ctx, svc)
	if err != nil {
		return etcdError("watch instances", err)
	}
	defer wt.Close()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	var rev int64
	for {
		nctx, ncancel := context.WithTimeout(ctx, keepAliveEvery)
		b, err := wt.Next(nctx)
		ncancel()
		var out adminapi.Batch
		switch {
		case err == nil:
			rev = b.Revision
			out = adminapi.Batch{Reset: b.Reset, Revision: b.Revision, Events: make([]adminapi.Event, 0, len(b.Events))}
			for _, ev := range b.Events {
				out.Events = append(out.Events, adminapi.Event{Type: ev.Type.String(), Instance: ev.Instance, Revision: ev.Revision})
			}
		case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
			out = adminapi.Batch{Revision: rev, Events: []adminapi.Event{}} // keep-alive
		default:
			return nil // the client left, the server is closing, or the watch ended: the client watches again
		}
		if err := enc.Encode(out); err != nil {
			return nil
		}
		if err := rc.Flush(); err != nil {
			return nil
		}
	}
}
