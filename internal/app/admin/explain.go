package admin

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// explain walks the chain of a request without touching the live engine:
// the instances come from etcd, the policy is the engine's, and the final
// decision comes from Resolve on a scratch engine holding just that service.
// A scratch engine knows no outlier state, so it never claims a half-open
// probe; the answer is the one of a caller whose instances are all healthy
// (outlier detection is per caller anyway).
func (s *Server) explain(w http.ResponseWriter, r *http.Request, _ *principal) error {
	q := r.URL.Query()
	svc := q.Get("service")
	if err := registry.CheckService(svc); err != nil {
		return fieldError("", err)
	}
	rawLane, zone, host, key := q.Get("lane"), q.Get("zone"), q.Get("host"), q.Get("key")
	ex := adminapi.Explanation{Service: svc, Zone: zone, Host: host, Key: key, Steps: []adminapi.ExplainStep{}}
	l := ""
	if rawLane != "" {
		n, err := lane.Parse(rawLane)
		if err != nil {
			ex.Notes = append(ex.Notes, fmt.Sprintf("%v: inside the mesh the request is routed as a baseline request (the gateway refuses it with 400)", err))
		} else {
			l = n
		}
	}
	ex.Lane = l
	regs, err := s.regs.List(r.Context(), svc)
	if err != nil {
		return etcdError("list instances", err)
	}
	insts := make([]registry.Instance, len(regs))
	for i, reg := range regs {
		insts[i] = reg.Instance
	}
	ex.Paths = s.paths(svc, insts)
	pol := s.engine.Policy()
	if pol == nil {
		pol = &policy.Policy{}
	}
	now := s.now()
	byHost := pol.Locality.Host && host != ""
	ex.HostFirst = pol.Locality.Host

	scratch := routing.New(routing.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	defer scratch.Close()
	decisionPolicy := pol
	canaryNote := false
	if l == "" && key == "" && rawLane == "" && hasCanary(pol, svc) {
		// Without a key the split is random: explain the baseline route,
		// and list the splits.
		cp := *pol
		cp.Canary = nil
		decisionPolicy = &cp
		canaryNote = true
	}
	scratch.SetPolicy(decisionPolicy)
	scratch.SetInstances(svc, insts)

	byLane := map[string][]registry.Instance{}
	for _, in := range insts {
		el := scratch.LaneOf(in)
		byLane[el] = append(byLane[el], in)
	}

	type lane struct {
		name, role string
	}
	var chain []lane
	strict := false
	if l != "" {
		c, st := pol.Chain(l)
		strict = st
		for i, n := range c {
			role := "lane"
			if i > 0 {
				role = "fallback"
			}
			chain = append(chain, lane{n, role})
		}
	}
	if !strict {
		chain = append(chain, lane{"", "baseline"})
	}
	ex.Strict = strict
	served := false
	for _, c := range chain {
		st := adminapi.ExplainStep{Lane: c.name, Role: c.role, Instances: []adminapi.ExplainInstance{}, Eligible: []string{}}
		st.Expired = c.name != "" && pol.Expired(c.name, now)
		members := byLane[c.name]
		slices.SortFunc(members, func(a, b registry.Instance) int {
			switch {
			case a.ID < b.ID:
				return -1
			case a.ID > b.ID:
				return 1
			}
			return 0
		})
		var candidates []int
		for _, in := range members {
			ei := adminapi.ExplainInstance{ID: in.ID, Addr: in.Addr, Zone: in.Zone, Host: in.Host, State: "eligible"}
			if in.Lane != c.name {
				ei.RegisteredLane = in.Lane
				if ei.RegisteredLane == "" {
					ei.RegisteredLane = "(baseline)"
				}
			}
			switch {
			case st.Expired:
				ei.State = "expired"
			case in.EffectiveWeight() == 0:
				ei.State = "drained"
			default:
				candidates = append(candidates, len(st.Instances))
			}
			st.Instances = append(st.Instances, ei)
		}
		// Locality: the caller's host first (when the policy says so),
		// then its zone.
		onHost, inZone := 0, 0
		for _, i := range candidates {
			if byHost && st.Instances[i].Host == host {
				onHost++
			}
			if zone != "" && st.Instances[i].Zone == zone {
				inZone++
			}
		}
		for _, i := range candidates {
			switch {
			case onHost > 0 && st.Instances[i].Host != host:
				st.Instances[i].State = "other-host"
				continue
			case onHost == 0 && inZone > 0 && st.Instances[i].Zone != zone:
				st.Instances[i].State = "other-zone"
				continue
			}
			st.Eligible = append(st.Eligible, st.Instances[i].ID)
		}
		switch {
		case served:
			st.Outcome = "not reached"
		case len(st.Eligible) > 0:
			st.Outcome, served = "serves", true
			var notes []string
			if byHost {
				if onHost > 0 {
					notes = append(notes, fmt.Sprintf("%d of %d eligible instances are on host %s: only those serve", onHost, len(candidates), host))
				} else if zone != "" {
					notes = append(notes, fmt.Sprintf("no eligible instance on host %s: the zone decides", host))
				} else {
					notes = append(notes, fmt.Sprintf("no eligible instance on host %s: every host serves", host))
				}
			}
			if zone != "" && onHost == 0 {
				if inZone > 0 {
					notes = append(notes, fmt.Sprintf("%d of %d eligible instances are in zone %s: only those serve", inZone, len(candidates), zone))
				} else {
					notes = append(notes, fmt.Sprintf("no eligible instance in zone %s: every zone serves", zone))
				}
			}
			st.Note = strings.Join(notes, "; ")
		default:
			st.Outcome = "empty"
			switch {
			case st.Expired:
				st.Note = fmt.Sprintf("lane expired at %s: its instances take no traffic", pol.Lanes[c.name].Expires.UTC().Format("2006-01-02T15:04:05Z07:00"))
			case len(members) == 0:
				st.Note = "no instance of " + svc
			default:
				st.Note = "every instance is drained"
			}
			if c.role == "baseline" && l == "" {
				st.Note += ": a baseline request never reaches a lane instance"
			}
		}
		ex.Steps = append(ex.Steps, st)
	}
	if strict && !served {
		ex.Steps[len(ex.Steps)-1].Outcome = "stops"
		ex.Notes = append(ex.Notes, fmt.Sprintf("the chain of lane %q is strict: it never falls back to the baseline", l))
	}

	if l == "" {
		for _, c := range pol.Canary {
			if c.Service != svc {
				continue
			}
			n := 0
			if !pol.Expired(c.Lane, now) {
				for _, in := range byLane[c.Lane] {
					if in.EffectiveWeight() > 0 {
						n++
					}
				}
			}
			ex.Canaries = append(ex.Canaries, adminapi.ExplainCanary{Lane: c.Lane, Percent: c.Percent, Instances: n})
		}
		if canaryNote {
			ex.Notes = append(ex.Notes, "baseline requests are split to the canaries listed, at random without a request key; the decision shown is for the share that stays in the baseline (give a key for its sticky answer)")
		}
	}

	req := routing.Request{Lane: rawLane, Zone: zone, Host: host, Key: key}
	d, err := scratch.Service(svc).Resolve(req)
	if err != nil {
		var re *routing.Error
		if !errors.As(err, &re) {
			return err
		}
		ex.Error = &adminapi.Error{Code: string(re.Code), Message: re.Error()}
	} else {
		ex.Decision = &adminapi.Decision{Lane: d.Lane, RequestLane: d.RequestLane, Reason: d.Reason.String(), Eligible: d.Eligible}
		if d.Eligible == nil {
			ex.Decision.Eligible = []string{}
		}
	}
	ex.Notes = append(ex.Notes, "outlier detection is per caller: ejections are not shown, and the decision is that of a caller whose instances are all healthy")
	writeJSON(w, http.StatusOK, ex)
	return nil
}

func hasCanary(p *policy.Policy, svc string) bool {
	for _, c := range p.Canary {
		if c.Service == svc {
			return true
		}
	}
	return false
}

// paths are the data paths of service svc: how its instances joined (their
// registry.LabelPath, in the order of routing.md's table), and the xDS
// clients that call it.
func (s *Server) paths(svc string, insts []registry.Instance) []adminapi.ExplainPath {
	n := map[string]int{}
	for _, in := range insts {
		p := in.Labels[registry.LabelPath]
		switch p {
		case registry.PathSDK, registry.PathSidecar, registry.PathDev:
		default:
			p = "unknown" // an older SDK, or a registration by hand
		}
		n[p]++
	}
	var out []adminapi.ExplainPath
	for _, p := range []string{registry.PathSDK, registry.PathSidecar, registry.PathDev, "unknown"} {
		if n[p] > 0 {
			out = append(out, adminapi.ExplainPath{Side: "instances", Path: p, Count: n[p]})
		}
	}
	if s.cfg.XDS != nil {
		grpc, envoy := s.cfg.XDS.Callers(svc)
		if grpc > 0 {
			out = append(out, adminapi.ExplainPath{Side: "callers", Path: "xds", Count: grpc})
		}
		if envoy > 0 {
			out = append(out, adminapi.ExplainPath{Side: "callers", Path: "envoy", Count: envoy})
		}
	}
	return out
}
