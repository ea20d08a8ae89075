package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/lib/addrpolicy"
	"github.com/lanesdev/lanes/internal/lib/regid"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

// MaxTTL bounds the TTL of a registration through the API.
const MaxTTL = time.Hour

// A registration through the API is an etcd lease granted by the control
// plane through etcdstore.Registrations (which alone writes instance keys),
// recording the token that made it. Its id, on the wire, is the lease id in
// hex. Only that token (or the admin token) may renew, update or end it:
// knowing the id is not enough. Heartbeats renew the lease; deregistering
// revokes it, which deletes the instance and any claim attached to it.

func parseLease(v string) (clientv3.LeaseID, error) {
	id, ok := regid.Parse[clientv3.LeaseID](v)
	if !ok {
		return 0, badRequest("registration", v, "not a registration id (a lease id in hex)")
	}
	return id, nil
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
	return forbidden("instance.lane", l, "%s cannot register into %s: a token registers only into its own lane, and the baseline needs a baseline token", p, laneName(l))
}

// checkLimits refuses an instance over p's label and size limits.
func (s *Server) checkLimits(p *principal, inst registry.Instance) error {
	lim := s.limits(p)
	if len(inst.Labels) > lim.Labels {
		return errorf(http.StatusRequestEntityTooLarge, adminapi.CodeLimit, "instance.labels", strconv.Itoa(len(inst.Labels)),
			"the instance has %d labels; %s may register at most %d per instance", len(inst.Labels), p, lim.Labels)
	}
	if val, _ := json.Marshal(inst); len(val) > lim.InstanceBytes {
		return errorf(http.StatusRequestEntityTooLarge, adminapi.CodeLimit, "instance", strconv.Itoa(len(val)),
			"the instance is %d bytes as JSON; %s may register at most %d bytes per instance", len(val), p, lim.InstanceBytes)
	}
	return nil
}

// limits returns the limits that apply to p: its token's, else the
// server's defaults. The admin token has no instance limit.
func (s *Server) limits(p *principal) adminapi.Limits {
	lim := s.cfg.Limits
	if p.admin {
		lim.Instances = 0
		return lim
	}
	if t := p.token.Limits; t != nil {
		if t.Instances > 0 {
			lim.Instances = t.Instances
		}
		if t.Labels > 0 {
			lim.Labels = t.Labels
		}
		if t.InstanceBytes > 0 {
			lim.InstanceBytes = t.InstanceBytes
		}
	}
	return lim
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
	// The scope is the credential's, not the client's claim.
	req.Instance.Scope = p.scope()
	inst, err := registry.Normalize(req.Instance)
	if err != nil {
		return fieldError("instance.", err)
	}
	if err := s.checkLimits(p, inst); err != nil {
		s.metrics.registrations.WithLabelValues("refused").Inc()
		return err
	}
	if !p.allows(inst.Lane) {
		s.metrics.registrations.WithLabelValues("refused").Inc()
		return scopeError(p, inst.Lane)
	}
	if err := s.refuseExpired(r.Context(), "instance.lane", inst.Lane); err != nil {
		s.metrics.registrations.WithLabelValues("refused").Inc()
		return err
	}
	if err := s.checkAddr(r.Context(), p, inst.Addr); err != nil {
		s.metrics.registrations.WithLabelValues("refused").Inc()
		return err
	}
	ctx := r.Context()

	if req.Registration != "" {
		// An update under the same registration, if it still holds the key.
		id, err := parseLease(req.Registration)
		if err != nil {
			return err
		}
		if err := s.authorize(ctx, p, id, req.Registration); err != nil {
			s.metrics.registrations.WithLabelValues("refused").Inc()
			return err
		}
		held, err := s.regs.Update(ctx, id, inst)
		if err != nil {
			return etcdError("update instance", err)
		}
		result := "updated"
		if !held {
			result = "replaced"
		}
		s.metrics.registrations.WithLabelValues(result).Inc()
		writeJSON(w, http.StatusOK, adminapi.Registration{Instance: inst, Registration: req.Registration, TTL: adminapi.Duration((ttl + time.Second - 1) / time.Second * time.Second), Held: held})
		return nil
	}

	reg, err := s.regs.Create(ctx, inst, ttl, etcdstore.CreateOptions{
		Owner:       p.owner(),
		IfAbsent:    req.IfAbsent,
		SameLane:    true,
		SameOwner:   !p.admin,
		MaxPerOwner: s.limits(p).Instances,
	})
	switch {
	case errors.Is(err, etcdstore.ErrHeld), errors.Is(err, etcdstore.ErrOtherLane), errors.Is(err, etcdstore.ErrOtherOwner):
		s.metrics.registrations.WithLabelValues("refused").Inc()
		return conflict("instance.id", inst.ID, "%v", err)
	case errors.Is(err, etcdstore.ErrLimit):
		s.metrics.registrations.WithLabelValues("refused").Inc()
		return errorf(http.StatusForbidden, adminapi.CodeLimit, "instance", inst.Service+"/"+inst.ID,
			"%s already holds %d registrations, as many as it may; end one first", p, s.limits(p).Instances)
	case err != nil:
		var fe *registry.FieldError
		if errors.As(err, &fe) {
			return fieldError("", err)
		}
		return etcdError("register instance", err)
	}
	rid := regid.Format(reg.Lease)
	s.metrics.registrations.WithLabelValues("created").Inc()
	s.log.Info("instance registered", "service", inst.Service, "id", inst.ID, "lane", inst.Lane, "addr", inst.Addr, "registration", rid, "by", p.String())
	writeJSON(w, http.StatusCreated, adminapi.Registration{Instance: reg.Instance, Registration: rid, TTL: adminapi.Duration(reg.TTL), Held: true})
	return nil
}

// refusedTag says why tag rule t, which matches in, does not move it into
// its lane.
func refusedTag(in registry.Instance, t policy.TagRule) string {
	by := "a lane token of " + laneName(in.Scope)
	if in.Scope == registry.ScopeBaseline {
		by = "a baseline token"
	}
	return fmt.Sprintf("the tag rule for %s does not apply: the instance was registered by %s, which may not register in %s",
		laneName(t.Lane), by, laneName(t.Lane))
}

// checkAddr refuses an instance address that p may not register: one that
// reaches a listener of the control plane (for anyone), a link-local or
// metadata one (unless allowed), one outside p's token's addresses.
func (s *Server) checkAddr(ctx context.Context, p *principal, addr string) error {
	var sc *adminapi.AddressScope
	if p.admin {
		sc = &adminapi.AddressScope{LinkLocal: true}
	} else {
		sc = p.token.Addresses
	}
	rules, err := s.addressRules(sc)
	if err != nil {
		// A stored scope that no longer parses: refuse, naming it.
		return err
	}
	err = rules.Check(ctx, addr)
	var ref *addrpolicy.Refusal
	if !errors.As(err, &ref) {
		return nil
	}
	at := ""
	if ref.IP.IsValid() && ref.IP.String() != addr {
		at = " (" + ref.IP.String() + ")"
	}
	scope := ""
	if strings.HasPrefix(ref.Rule, "addresses.") || ref.Rule == "resolve" {
		scope = "; " + p.String() + " registers only within its addresses"
	}
	return errorf(http.StatusForbidden, adminapi.CodeAddress, "instance.addr", addr, "instance.addr %q%s %s%s", addr, at, ref.Msg, scope)
}

func laneName(l string) string {
	if l == "" {
		return "the baseline"
	}
	return "lane " + strconv.Quote(l)
}

// authorize checks that p may act on registration id (reg as the caller
// wrote it): a token only on registrations it made, the admin on any. It
// fails with 404 when the registration does not exist (any more), 403 when
// it belongs to another.
func (s *Server) authorize(ctx context.Context, p *principal, id clientv3.LeaseID, reg string) error {
	if !p.admin {
		own, err := s.regs.Owns(ctx, p.token.ID, id)
		if err != nil {
			return etcdError("read registration", err)
		}
		if own {
			return nil
		}
	}
	alive, err := s.regs.Alive(ctx, id)
	if err != nil {
		return etcdError("read registration", err)
	}
	if !alive {
		return notFound("registration", reg, "registration %s has expired or was never made", reg)
	}
	if p.admin {
		return nil
	}
	return forbidden("registration", reg, "%s did not make registration %s: a token acts only on the registrations it made", p, reg)
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
	if err := s.authorize(ctx, p, id, req.Registration); err != nil {
		if ae, ok := err.(*apiError); ok {
			result := "refused"
			if ae.status == http.StatusNotFound {
				result = "expired"
			}
			s.metrics.heartbeats.WithLabelValues(result).Inc()
		}
		return err
	}
	cur, ok, err := s.regs.Holder(ctx, r.PathValue("service"), r.PathValue("id"))
	if err != nil {
		return etcdError("read instance", err)
	}
	var inst registry.Instance
	held := ok && cur.Lease == id
	if held {
		inst = cur.Instance
		if !p.allows(inst.Lane) {
			s.metrics.heartbeats.WithLabelValues("refused").Inc()
			return forbidden("registration", req.Registration, "%s cannot renew an instance of %s", p, laneName(inst.Lane))
		}
		// The engine's copy of the policy follows etcd within moments;
		// heartbeats are frequent, so they do not read etcd for it.
		if pol := s.engine.Policy(); pol.Expired(inst.Lane, s.now()) {
			s.endRegistration(id)
			s.metrics.heartbeats.WithLabelValues("lane_expired").Inc()
			s.log.Info("registration ended: its lane has expired", "service", inst.Service, "id", inst.ID, "lane", inst.Lane)
			return errorf(http.StatusGone, adminapi.CodeLaneExpired, "instance.lane", inst.Lane, "lane %q has expired; registration %s is ended", inst.Lane, req.Registration)
		}
	}
	ttl, err := s.regs.Renew(ctx, id)
	if errors.Is(err, etcdstore.ErrNoRegistration) {
		s.metrics.heartbeats.WithLabelValues("expired").Inc()
		return notFound("registration", req.Registration, "registration %s has expired; register again", req.Registration)
	}
	if err != nil {
		return etcdError("renew registration", err)
	}
	s.metrics.heartbeats.WithLabelValues("ok").Inc()
	writeJSON(w, http.StatusOK, adminapi.Registration{Instance: inst, Registration: req.Registration, TTL: adminapi.Duration(ttl), Held: held})
	return nil
}

// endRegistration ends a registration, best effort, bounded.
func (s *Server) endRegistration(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.regs.End(ctx, id); err != nil {
		s.log.Warn("could not end a registration; it expires with its TTL", "registration", regid.Format(id), "err", err)
	}
}

func (s *Server) deregister(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	service, iid := r.PathValue("service"), r.PathValue("id")
	reg := r.URL.Query().Get("registration")
	if reg == "" {
		// Removal by the admin, whatever holds it.
		if !p.admin {
			return badRequest("registration", "", "name the registration to end (?registration=<id>); only the admin token removes an instance without it")
		}
		found, err := s.regs.Remove(ctx, service, iid)
		if err != nil {
			return etcdError("delete instance", err)
		}
		if !found {
			return notFound("id", iid, "no instance %s/%s", service, iid)
		}
		s.log.Info("instance removed by the admin", "service", service, "id", iid)
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	id, err := parseLease(reg)
	if err != nil {
		return err
	}
	if err := s.authorize(ctx, p, id, reg); err != nil {
		return err
	}
	if err := s.regs.End(ctx, id); err != nil {
		return etcdError("end registration", err)
	}
	s.log.Info("instance deregistered", "service", service, "id", iid, "registration", reg)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// views returns the instances as the API shows them to p: the registration
// id only to its owner and to the admin.
func (s *Server) views(ctx context.Context, p *principal, service string) ([]adminapi.Instance, error) {
	regs, err := s.regs.List(ctx, service)
	if err != nil {
		return nil, etcdError("list instances", err)
	}
	var owned map[clientv3.LeaseID]bool
	if p != nil && !p.admin {
		if owned, err = s.regs.Owned(ctx, p.token.ID); err != nil {
			return nil, etcdError("list registrations", err)
		}
	}
	pol := s.engine.Policy()
	now := s.now()
	out := make([]adminapi.Instance, 0, len(regs))
	outliers := map[string]map[string]*adminapi.Outlier{} // service → id
	view := func(in registry.Instance) adminapi.Instance {
		v := adminapi.Instance{Instance: in, EffectiveLane: s.engine.LaneOf(in), State: "ready"}
		for _, t := range s.engine.RefusedTags(in) {
			v.TagsRefused = append(v.TagsRefused, refusedTag(in, t))
		}
		if _, ok := outliers[in.Service]; !ok {
			m := map[string]*adminapi.Outlier{}
			for _, o := range s.engine.Service(in.Service).Outliers() {
				ao := &adminapi.Outlier{State: o.State}
				if !o.Until.IsZero() {
					u := o.Until.UTC()
					ao.Until = &u
				}
				m[o.ID] = ao
			}
			outliers[in.Service] = m
		}
		v.Outlier = outliers[in.Service][in.ID]
		switch {
		case pol.Expired(v.EffectiveLane, now):
			v.State = "expired"
		case in.EffectiveWeight() == 0:
			v.State = "drained"
		}
		return v
	}
	for _, reg := range regs {
		v := view(reg.Instance)
		if reg.Lease != 0 && p != nil && (p.admin || owned[reg.Lease]) {
			v.Registration = regid.Format(reg.Lease)
		}
		out = append(out, v)
	}
	if s.fleet != registry.Registry(s.store) {
		// The engine follows more than etcd (the pods of a cluster): the
		// fleet's instances that are no registration are listed too.
		known := make(map[[2]string]bool, len(regs))
		for _, reg := range regs {
			known[[2]string{reg.Instance.Service, reg.Instance.ID}] = true
		}
		all, err := listFleet(ctx, s.fleet, service)
		if err != nil {
			return nil, errorf(http.StatusServiceUnavailable, adminapi.CodeUnavailable, "", "", "list the fleet's instances: %v", err)
		}
		for _, in := range all {
			if !known[[2]string{in.Service, in.ID}] {
				out = append(out, view(in))
			}
		}
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

func (s *Server) listInstances(w http.ResponseWriter, r *http.Request, p *principal) error {
	svc := r.URL.Query().Get("service")
	if svc != "" {
		if err := registry.CheckService(svc); err != nil {
			return fieldError("", err)
		}
	}
	out, err := s.views(r.Context(), p, svc)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"instances": out})
	return nil
}

func (s *Server) listServices(w http.ResponseWriter, r *http.Request, p *principal) error {
	insts, err := s.views(r.Context(), p, "")
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

func (s *Server) watchInstances(w http.ResponseWriter, r *http.Request, _ *principal) error {
	svc := r.URL.Query().Get("service")
	if svc != "" {
		if err := registry.CheckService(svc); err != nil {
			return fieldError("", err)
		}
	}
	var rev int64
	return serveStream(s, w, r, "watch instances",
		func(ctx context.Context) (watcher[registry.Batch], error) { return s.fleet.Watch(ctx, svc) },
		func(b registry.Batch) any {
			rev = b.Revision
			out := adminapi.Batch{Reset: b.Reset, Revision: b.Revision, Events: make([]adminapi.Event, 0, len(b.Events))}
			for _, ev := range b.Events {
				out.Events = append(out.Events, adminapi.Event{Type: ev.Type.String(), Instance: ev.Instance, Revision: ev.Revision})
			}
			return out
		},
		func() any { return adminapi.Batch{Revision: rev, Events: []adminapi.Event{}} })
}

// listFleet returns the instances of service (of all when "") in r: the
// first batch of a watch, which lists them.
func listFleet(ctx context.Context, r registry.Registry, service string) ([]registry.Instance, error) {
	w, err := r.Watch(ctx, service)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	b, err := w.Next(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]registry.Instance, 0, len(b.Events))
	for _, ev := range b.Events {
		out = append(out, ev.Instance)
	}
	return out, nil
}
