// Package policy holds the lanes policy document: per-lane settings (fallback
// chains, strict lanes), dynamic lane membership rules, canary splits and the
// outlier-detection settings. It parses and validates documents (YAML or
// JSON) and defines the Store that keeps the one document in force.
//
// A document is refused as a whole when any part of it is invalid; every
// refusal names the line and the field. See docs/policy.md for the reference.
package policy

import (
	"encoding/json"
	"fmt"
	"time"
)

// Default outlier-detection settings, used for every field the document
// leaves out.
const (
	DefaultErrors   = 5
	DefaultWindow   = 30 * time.Second
	DefaultEjection = 30 * time.Second
)

// Policy is one policy document. The zero value is the empty policy: no lane
// settings, no tags, no canaries and the default outlier settings.
//
// A *Policy returned by Parse is validated and normalised (lane names are
// lower-cased). Treat it as immutable: the routing engine shares it.
type Policy struct {
	Lanes    map[string]LaneSettings `yaml:"lanes" json:"lanes,omitempty"`
	Tags     []TagRule               `yaml:"tags" json:"tags,omitempty"`
	Canary   []CanaryRule            `yaml:"canary" json:"canary,omitempty"`
	Locality Locality                `yaml:"locality" json:"locality"`
	Outlier  Outlier                 `yaml:"outlier" json:"outlier"`
	Gateway  Gateway                 `yaml:"gateway" json:"gateway"`
}

// Lane choice at the gateway: who may pick a request's lane with what it
// sends: the x-lane header, the lane baggage member, the alias headers, the
// lane cookie and the <lane>.<domain> host.
const (
	ChoiceAll       = "all"       // every client (the default)
	ChoiceNone      = "none"      // no client: lanes come from client-address claims and canaries only
	ChoiceAllowlist = "allowlist" // clients whose address is in Gateway.Allow
)

// Gateway holds the rules the edge applies when it assigns a request's lane.
type Gateway struct {
	// LaneChoice says which clients may choose a lane with what they send
	// (headers, cookie, host): ChoiceAll (default), ChoiceNone or
	// ChoiceAllowlist. Nothing of the kind is read from any other client,
	// and its lane headers are stripped. Client-address claims are not a
	// client's choice: they keep working.
	LaneChoice string `yaml:"lane_choice" json:"lane_choice,omitempty"`
	// Allow lists the client addresses (IPs or CIDRs) that may choose a lane
	// when LaneChoice is ChoiceAllowlist.
	Allow []string `yaml:"allow" json:"allow,omitempty"`
}

// Choice returns the gateway's lane choice, defaulted.
func (g Gateway) Choice() string {
	if g.LaneChoice == "" {
		return ChoiceAll
	}
	return g.LaneChoice
}

// LaneSettings are the optional settings of one lane.
type LaneSettings struct {
	// Fallback lists the lanes tried in order, after the lane itself and
	// before the baseline.
	Fallback []string `yaml:"fallback" json:"fallback,omitempty"`
	// Strict stops the chain before the baseline: a request whose chain has
	// no instance fails with lane_unavailable instead.
	Strict bool `yaml:"strict" json:"strict,omitempty"`
	// Expires, when set, ends the lane: from then on its instances take no
	// traffic (requests for it fall back as for an empty lane) and the
	// control plane refuses to register new ones.
	Expires *time.Time `yaml:"expires" json:"expires,omitempty"`
	// Clients claims client addresses (IPs or CIDRs) for the lane: the
	// gateway assigns the lane to requests from them.
	Clients []string `yaml:"clients" json:"clients,omitempty"`
}

// Expired reports whether lane l has expired at t.
func (p *Policy) Expired(l string, t time.Time) bool {
	if p == nil {
		return false
	}
	e := p.Lanes[l].Expires
	return e != nil && !t.Before(*e)
}

// TagRule assigns a lane to the instances of a service that it matches,
// whatever lane they registered with. Exactly one of Addrs and Labels is set.
type TagRule struct {
	Service string            `yaml:"service" json:"service"`
	Lane    string            `yaml:"lane" json:"lane"`
	Addrs   []string          `yaml:"addrs" json:"addrs,omitempty"`   // "host:port" or "*:port"
	Labels  map[string]string `yaml:"labels" json:"labels,omitempty"` // all must match
	Enabled *bool             `yaml:"enabled" json:"enabled,omitempty"`
}

// IsEnabled reports whether the rule applies; rules are enabled by default.
func (r TagRule) IsEnabled() bool { return r.Enabled == nil || *r.Enabled }

// PercentStep is the granularity of a canary's Percent: splits are made in
// steps of 0.01%, and a percent that is not a whole number of steps (such as
// 0.005 or 12.345) is refused by validation rather than rounded.
const PercentStep = 0.01

// CanaryRule sends Percent percent of the baseline requests for Service to
// Lane, when Lane has instances of Service. Percent is 0 to 100, in steps of
// PercentStep.
type CanaryRule struct {
	Service string  `yaml:"service" json:"service"`
	Lane    string  `yaml:"lane" json:"lane"`
	Percent float64 `yaml:"percent" json:"percent"`
}

// Locality turns on the locality rules that are off by default. Zone
// preference is always on; same-host preference is opt-in.
type Locality struct {
	// Host prefers, within the serving lane, the instances on the caller's
	// host (when the caller's host is known and one of them runs there),
	// before the caller's zone. Default false.
	Host bool `yaml:"host" json:"host,omitempty"`
}

// Outlier configures outlier detection. Zero fields take the defaults.
type Outlier struct {
	// Errors failures within Window eject an instance.
	Errors int `yaml:"errors" json:"errors,omitempty"`
	// Window is the length of the sliding window the failures are counted in.
	Window Duration `yaml:"window" json:"window,omitempty"`
	// Ejection is how long an ejected instance waits before its half-open
	// probe.
	Ejection Duration `yaml:"ejection" json:"ejection,omitempty"`
}

// WithDefaults returns o with every unset field defaulted.
func (o Outlier) WithDefaults() Outlier {
	if o.Errors == 0 {
		o.Errors = DefaultErrors
	}
	if o.Window == 0 {
		o.Window = Duration(DefaultWindow)
	}
	if o.Ejection == 0 {
		o.Ejection = Duration(DefaultEjection)
	}
	return o
}

// Duration is a time.Duration written as a Go duration string ("30s").
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalText reads a duration string such as "30s".
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("bad duration %q: want a number with a unit, such as \"30s\" or \"1m30s\"", b)
	}
	*d = Duration(v)
	return nil
}

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"30s\"")
	}
	return d.UnmarshalText([]byte(s))
}

// Chain returns the lanes that a request for lane l tries, in order, before
// the baseline, and whether the chain is strict (stops before the baseline).
// The chain starts with l itself. It stops at the first strict lane. l must
// be a normalised lane name; the baseline ("") has an empty chain.
func (p *Policy) Chain(l string) (chain []string, strict bool) {
	if l == "" {
		return nil, false
	}
	chain = []string{l}
	if p == nil {
		return chain, false
	}
	seen := map[string]bool{l: true}
	if p.Lanes[l].Strict {
		return chain, true
	}
	for _, f := range p.Lanes[l].Fallback {
		if seen[f] {
			continue
		}
		seen[f] = true
		chain = append(chain, f)
		if p.Lanes[f].Strict {
			return chain, true
		}
	}
	return chain, false
}
