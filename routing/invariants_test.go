package routing

import (
	"flag"
	"fmt"
	"slices"
	"strings"
)

// Every snapshot that the routing package's tests build (the differential
// tests against the contract's model among them) is checked for the
// invariants below as soon as it is built. A broken one panics with what
// broke, naming the service. Benchmarks (-test.bench) skip the check, so
// that it does not count in a rebuild's cost.
func init() {
	afterBuild = func(s *snapshot) {
		if f := flag.Lookup("test.bench"); f != nil && f.Value.String() != "" {
			return
		}
		if err := s.invariants(); err != nil {
			panic(fmt.Sprintf("routing: snapshot of %q breaks an invariant: %v", s.service, err))
		}
	}
}

// invariants checks what every snapshot must hold:
//   - no lane instance in a baseline route (the baseline's, an invalid
//     lane's, an unknown lane's, and where a canary split sends a request
//     back);
//   - every route has an eligible set that is not empty, or a prebuilt
//     error, and a next route wherever its group has no ready instance;
//   - a lane's route serves a lane of its chain, or the baseline when the
//     chain is not strict;
//   - the members of a group are of its lane and in the state its lists say;
//   - the zone and host sub-groups of a group cover exactly the group's
//     members that have a zone or a host, each in its own sub-group, and a
//     group whose members' zones differ has zone sub-groups.
func (s *snapshot) invariants() error {
	baseline := func(name string, r *route) error {
		for ; r != nil; r = r.next {
			if r.err != nil {
				continue
			}
			if r.lane != "" {
				return fmt.Errorf("%s route served by lane %q", name, r.lane)
			}
			if err := r.group.check(""); err != nil {
				return fmt.Errorf("%s route: %w", name, err)
			}
		}
		return nil
	}
	for name, r := range map[string]*route{"baseline": &s.baseline, "invalid-lane": &s.invalid, "unknown-lane": &s.unknown} {
		if err := routeShape(name, r); err != nil {
			return err
		}
		if err := baseline(name, r); err != nil {
			return err
		}
	}
	for _, c := range s.canaries {
		if c.invalid.next != &s.invalid || c.route.next != &s.baseline || c.invalid.group != c.route.group {
			return fmt.Errorf("canary %q: its routes do not fall back to the baseline's and the invalid lane's", c.lane)
		}
		if err := routeShape("canary "+c.lane, c.route); err != nil {
			return err
		}
		if c.route.lane != c.lane || c.route.group.lane != c.lane {
			return fmt.Errorf("canary %q route serves lane %q", c.lane, c.route.lane)
		}
		if err := c.route.group.check(c.lane); err != nil {
			return fmt.Errorf("canary %q: %w", c.lane, err)
		}
		if err := baseline("canary "+c.lane+" fallback", c.route.next); err != nil {
			return err
		}
	}
	for l, r := range s.routes {
		if err := routeShape("lane "+l, r); err != nil {
			return err
		}
		chain, strict := s.cp.chain(l)
		for ; r != nil; r = r.next {
			if r.err != nil {
				continue
			}
			if !slices.Contains(chain, r.lane) && (r.lane != "" || strict) {
				return fmt.Errorf("lane %q route served by lane %q, outside its chain %v (strict %v)", l, r.lane, chain, strict)
			}
			if err := r.group.check(r.lane); err != nil {
				return fmt.Errorf("lane %q route: %w", l, err)
			}
		}
	}
	return nil
}

// routeShape checks that r and the routes after it each have an error or a
// group that is not empty, and a next route where the group has no ready
// instance.
func routeShape(name string, r *route) error {
	for i := 0; r != nil; r, i = r.next, i+1 {
		switch {
		case i > 10:
			return fmt.Errorf("%s route: a chain of more than 10 next routes", name)
		case r.err != nil && r.group != nil:
			return fmt.Errorf("%s route: both an error and a group", name)
		case r.err == nil && r.group.empty():
			return fmt.Errorf("%s route: no error and no eligible instance", name)
		case r.err == nil && len(r.group.ready) == 0 && r.next == nil:
			return fmt.Errorf("%s route: only half-open instances and no next route", name)
		case r.ready != nil && (r.ready != r.group || len(r.group.halfOpen) > 0):
			return fmt.Errorf("%s route: a fast path on a group with probes to send", name)
		}
	}
	return nil
}

// check checks the members and the sub-groups of g, a group of lane l.
func (g *group) check(l string) error {
	if g.lane != l {
		return fmt.Errorf("group of lane %q in a route of lane %q", g.lane, l)
	}
	for _, m := range g.ready {
		if m.lane != l {
			return fmt.Errorf("%s of lane %q in the group of lane %q", m.inst.ID, m.lane, l)
		}
		if m.state != stateHealthy && !g.panic {
			return fmt.Errorf("%s is ready but %s", m.inst.ID, stateNames[m.state])
		}
	}
	for _, m := range g.halfOpen {
		if m.lane != l || m.state != stateHalfOpen {
			return fmt.Errorf("%s (lane %q, %s) among the half-open of lane %q", m.inst.ID, m.lane, stateNames[m.state], l)
		}
	}
	if err := g.zones.cover(g, zoneOf); err != nil {
		return fmt.Errorf("zones: %w", err)
	}
	zones := map[string]bool{} // "" for a member without a zone
	for _, m := range append(slices.Clone(g.ready), g.halfOpen...) {
		zones[m.inst.Zone] = true
	}
	if g.zones == nil && len(zones) > 1 {
		return fmt.Errorf("members in several zones (or in one and none) but no zone sub-groups: %s", ids(g))
	}
	if err := g.hosts.cover(g, hostOf); err != nil {
		return fmt.Errorf("hosts: %w", err)
	}
	return nil
}

// cover checks that the sub-groups s of g (nil for none) hold exactly g's
// members with a key, each in the sub-group of its key, none empty.
func (s *subgroups) cover(g *group, key func(*member) string) error {
	if s == nil {
		return nil
	}
	for _, list := range []struct {
		of  func(*group) []*member
		all []*member
	}{{func(g *group) []*member { return g.ready }, g.ready}, {func(g *group) []*member { return g.halfOpen }, g.halfOpen}} {
		n := 0
		for i := range s.entries {
			e := &s.entries[i]
			if e.g.empty() {
				return fmt.Errorf("the sub-group of %q is empty", e.key)
			}
			if e.g.lane != g.lane || e.g.panic != g.panic || e.g.hosts != nil || e.g.zones != nil {
				return fmt.Errorf("the sub-group of %q is not its group's", e.key)
			}
			for _, m := range list.of(&e.g) {
				if key(m) != e.key || !slices.Contains(list.all, m) {
					return fmt.Errorf("%s in the sub-group of %q", m.inst.ID, e.key)
				}
				n++
			}
		}
		keyed := 0
		for _, m := range list.all {
			if key(m) != "" {
				keyed++
			}
		}
		if n != keyed {
			return fmt.Errorf("the sub-groups hold %d members, the group %d with a key: %s", n, keyed, ids(g))
		}
	}
	return nil
}

func ids(g *group) string {
	var out []string
	for _, m := range g.ready {
		out = append(out, m.inst.ID+"("+m.inst.Zone+","+m.inst.Host+")")
	}
	for _, m := range g.halfOpen {
		out = append(out, m.inst.ID+"(half-open)")
	}
	return strings.Join(out, " ")
}
