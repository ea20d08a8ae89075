// Package reroute computes what a policy change would reroute: for every
// service of a fleet and every lane that the fleet or either policy names
// (and the baseline), where a request goes under the policy in force and
// where it would go under the new one, and which lane lifetimes it sets,
// moves or lifts. `lanes policy apply --dry-run` prints
// it and the dashboard's policy page shows it before a change is applied.
package reroute

import (
	"errors"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// Change is one route that the new policy changes.
type Change struct {
	Service string
	Lane    string // the request lane; "" for the baseline
	Now     string // where it goes under the policy in force (Describe)
	Next    string // where it would go
}

// Changes returns the routes of the fleet insts that next changes from
// now, sorted by service and lane. A nil policy is the empty one.
func Changes(now, next *policy.Policy, insts []adminapi.Instance) []Change {
	if now == nil {
		now = &policy.Policy{}
	}
	if next == nil {
		next = &policy.Policy{}
	}
	bySvc := map[string][]registry.Instance{}
	lanes := map[string]bool{"": true}
	for _, in := range insts {
		bySvc[in.Service] = append(bySvc[in.Service], in.Instance)
		lanes[in.Lane] = true
		lanes[in.EffectiveLane] = true
	}
	for _, p := range []*policy.Policy{now, next} {
		for l := range p.Lanes {
			lanes[l] = true
		}
		for _, t := range p.Tags {
			lanes[t.Lane] = true
		}
		for _, k := range p.Canary {
			lanes[k.Lane] = true
		}
	}
	routes := func(p *policy.Policy) map[[2]string]string {
		e := routing.New()
		defer e.Close()
		e.SetPolicy(p)
		out := map[[2]string]string{}
		for svc, in := range bySvc {
			e.SetInstances(svc, in)
			s := e.Service(svc)
			for l := range lanes {
				out[[2]string{svc, l}] = Describe(s.Resolve(routing.Request{Lane: l}))
			}
		}
		return out
	}
	before, after := routes(now), routes(next)
	var out []Change
	for k, v := range after {
		if before[k] != v {
			out = append(out, Change{Service: k[0], Lane: k[1], Now: before[k], Next: v})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Service < out[j].Service || out[i].Service == out[j].Service && out[i].Lane < out[j].Lane
	})
	return out
}

// Lifetime is a lane lifetime (lanes.<lane>.expires) that a policy change
// sets, moves or lifts.
type Lifetime struct {
	Lane string
	Now  string // the expiry in force (RFC 3339), or "none"
	Next string // the expiry after the change, or "none"
}

// Lifetimes returns the lane lifetimes that next changes from now, sorted
// by lane. A nil policy is the empty one.
func Lifetimes(now, next *policy.Policy) []Lifetime {
	expiry := func(p *policy.Policy, l string) string {
		if p == nil || p.Lanes[l].Expires == nil {
			return "none"
		}
		return p.Lanes[l].Expires.UTC().Format(time.RFC3339)
	}
	lanes := map[string]bool{}
	for _, p := range []*policy.Policy{now, next} {
		if p != nil {
			for l := range p.Lanes {
				lanes[l] = true
			}
		}
	}
	var out []Lifetime
	for _, l := range slices.Sorted(maps.Keys(lanes)) {
		if a, b := expiry(now, l), expiry(next, l); a != b {
			out = append(out, Lifetime{Lane: l, Now: a, Next: b})
		}
	}
	return out
}

// Describe says where a resolved request goes: the serving lane and its
// eligible instances, or the error code.
func Describe(d routing.Decision, err error) string {
	var re *routing.Error
	if errors.As(err, &re) {
		return string(re.Code)
	}
	if err != nil {
		return err.Error()
	}
	ids := slices.Clone(d.Eligible)
	sort.Strings(ids)
	s := Label(d.Lane) + ": " + strings.Join(ids, ",")
	if d.RequestLane != "" && d.RequestLane != d.Lane {
		s += " (lane " + d.RequestLane + ")"
	}
	return s
}

// Label names a lane, "(baseline)" for "".
func Label(l string) string {
	if l == "" {
		return "(baseline)"
	}
	return l
}
