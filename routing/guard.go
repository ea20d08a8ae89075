package routing

import (
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

// Admits reports whether an instance serving lane serving may take a request
// that carries lane requestLane: the provider-side guard of every transport
// asks it. A baseline instance ("") admits every request, since lane requests
// fall back to the baseline. A lane instance admits only requests whose lane
// chain contains its lane; never a baseline request. requestLane is
// normalised as Pick normalises it; an invalid value is a baseline request.
//
// serving is the instance's effective lane (after dynamic tag rules); see
// Engine.LaneOf.
func (e *Engine) Admits(serving, requestLane string) bool {
	return e.policy.Load().admits(serving, requestLane)
}

// LaneOf returns the effective lane of an instance: the lane of the first
// enabled dynamic tag rule that matches it and may move it there
// (registry.Instance.MayJoin), or else its registered lane.
func (e *Engine) LaneOf(in registry.Instance) string { return e.policy.Load().laneOf(&in) }

// RefusedTags returns the enabled tag rules of the policy in force that
// match in but do not apply to it, because the credential that registered
// it may not register in their lanes (registry.Instance.MayJoin), before
// the rule that gives it its lane.
func (e *Engine) RefusedTags(in registry.Instance) []policy.TagRule {
	return e.policy.Load().refusedTags(&in)
}

// admits is the guard's rule under the policy c (see Engine.Admits).
func (c *compiled) admits(serving, requestLane string) bool {
	if serving == "" {
		return true
	}
	l, ok := lane.Normalize(requestLane)
	if !ok || l == "" {
		return false
	}
	if l == serving {
		return true
	}
	chain, _ := c.chain(l)
	for _, x := range chain {
		if x == serving {
			return true
		}
	}
	return false
}
