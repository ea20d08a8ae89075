package routing

import (
	"net"
	"strconv"
	"strings"

	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

// compiled is a policy prepared for snapshot builds.
type compiled struct {
	policy   *policy.Policy
	outlier  policy.Outlier
	tags     map[string][]policy.TagRule // enabled rules, by service, in order
	canaries map[string][]policy.CanaryRule
	chains   map[string]chain
	expires  map[string]int64 // lane -> expiry (unix ns)
}

type chain struct {
	lanes  []string
	strict bool
}

func compile(p *policy.Policy) *compiled {
	if p == nil {
		p = &policy.Policy{}
	}
	c := &compiled{
		policy:   p,
		outlier:  p.Outlier.WithDefaults(),
		tags:     map[string][]policy.TagRule{},
		canaries: map[string][]policy.CanaryRule{},
		chains:   map[string]chain{},
	}
	for _, t := range p.Tags {
		if t.IsEnabled() {
			c.tags[t.Service] = append(c.tags[t.Service], t)
		}
	}
	for _, k := range p.Canary {
		c.canaries[k.Service] = append(c.canaries[k.Service], k)
	}
	for l, set := range p.Lanes {
		ls, strict := p.Chain(l)
		c.chains[l] = chain{ls, strict}
		if set.Expires != nil {
			if c.expires == nil {
				c.expires = map[string]int64{}
			}
			c.expires[l] = set.Expires.UnixNano()
		}
	}
	return c
}

func (c *compiled) chain(l string) ([]string, bool) {
	if ch, ok := c.chains[l]; ok {
		return ch.lanes, ch.strict
	}
	return []string{l}, false
}

// laneOf is the effective lane of an instance: the lane of the first enabled
// tag rule that matches it and may move it there (registry.Instance.MayJoin),
// or else its registered lane.
func (c *compiled) laneOf(in *registry.Instance) string {
	for _, t := range c.tags[in.Service] {
		if matches(t, in) && in.MayJoin(t.Lane) {
			return t.Lane
		}
	}
	return in.Lane
}

// refusedTags returns the enabled tag rules that match in but may not move
// it into their lanes, before the one that gives it its lane.
func (c *compiled) refusedTags(in *registry.Instance) []policy.TagRule {
	var out []policy.TagRule
	for _, t := range c.tags[in.Service] {
		if matches(t, in) {
			if in.MayJoin(t.Lane) {
				break
			}
			out = append(out, t)
		}
	}
	return out
}

func matches(t policy.TagRule, in *registry.Instance) bool {
	if len(t.Addrs) > 0 {
		for _, a := range t.Addrs {
			if port, ok := strings.CutPrefix(a, "*:"); ok {
				if _, p, err := net.SplitHostPort(in.Addr); err == nil && samePort(p, port) {
					return true
				}
			} else if a == in.Addr {
				return true
			}
		}
		return false
	}
	for k, v := range t.Labels {
		if got, ok := in.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func samePort(a, b string) bool {
	x, err1 := strconv.Atoi(a)
	y, err2 := strconv.Atoi(b)
	return err1 == nil && err2 == nil && x == y
}
