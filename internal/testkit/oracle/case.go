package oracle

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lanesdev/lanes/internal/lib/scenario"
)

// Case is a scenario as the generator makes it and the shrinker cuts it:
// plain values, rendered to the scenario format by YAML. What is run is
// always the rendered text, parsed as `lanes simulate` parses it.
type Case struct {
	Name      string
	Policy    Policy
	Instances []Instance
	Steps     []Step
}

// Policy is the part of a policy document the generator varies.
type Policy struct {
	Lanes   []LaneSettings
	Tags    []Tag
	Canary  []Canary
	Host    bool          // locality.host
	Errors  int           // outlier.errors; 0 leaves it out
	Window  time.Duration // outlier.window; 0 leaves it out
	Ejected time.Duration // outlier.ejection; 0 leaves it out
}

// LaneSettings are one lane's settings.
type LaneSettings struct {
	Lane     string
	Fallback []string
	Strict   bool
	Expires  time.Duration // since the scenario's start; 0 for none
}

// Tag is a dynamic lane rule: exactly one of Addrs and Labels is set.
type Tag struct {
	Service  string
	Lane     string
	Addrs    []string
	Labels   map[string]string
	Disabled bool
}

// Canary is a canary rule.
type Canary struct {
	Service string
	Lane    string
	Percent float64
}

// Instance is a registered instance. Weight 0 drains it; -1 leaves the
// weight out (the default, 100).
type Instance struct {
	ID, Service, Addr, Lane, Zone, Host string
	Weight                              int
	Labels                              map[string]string
	Scope                               string // the registering credential's lane scope
}

// Step is a request or an outcome report, at a virtual time since the start.
type Step struct {
	At      time.Duration
	Request *Request
	Report  *Report
	// Want is the model's answer, written as the step's expectations by
	// Print; nil writes none.
	Want *Answer
}

// Report is the outcome of a call to an instance.
type Report struct {
	Service, Instance string
	OK                bool
}

// YAML renders c in the scenario format.
func (c *Case) YAML() []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "name: %s\n", q(c.Name))
	if p := c.Policy.yaml(); p != "" {
		b.WriteString("policy:\n" + p)
	}
	b.WriteString("instances:\n")
	for _, in := range c.Instances {
		fmt.Fprintf(&b, "  - {id: %s, service: %s, addr: %s", q(in.ID), q(in.Service), q(in.Addr))
		opt(&b, "lane", in.Lane)
		opt(&b, "zone", in.Zone)
		opt(&b, "host", in.Host)
		if in.Weight >= 0 {
			fmt.Fprintf(&b, ", weight: %d", in.Weight)
		}
		if len(in.Labels) > 0 {
			fmt.Fprintf(&b, ", labels: %s", labels(in.Labels))
		}
		opt(&b, "scope", in.Scope)
		b.WriteString("}\n")
	}
	b.WriteString("steps:\n")
	var at time.Duration
	for _, st := range c.Steps {
		prefix := "  - "
		if st.At != at {
			fmt.Fprintf(&b, "%sat: %s\n", prefix, st.At)
			prefix, at = "    ", st.At
		}
		if r := st.Report; r != nil {
			fmt.Fprintf(&b, "%sreport: {service: %s, instance: %s, ok: %t}\n", prefix, q(r.Service), q(r.Instance), r.OK)
			continue
		}
		r := st.Request
		fmt.Fprintf(&b, "%srequest: {service: %s", prefix, q(r.Service))
		opt(&b, "lane", r.Lane)
		opt(&b, "zone", r.Zone)
		opt(&b, "host", r.Host)
		opt(&b, "key", r.Key)
		b.WriteString("}\n")
		if w := st.Want; w != nil {
			if w.Error != "" {
				fmt.Fprintf(&b, "    expect_error: %s\n", w.Error)
				continue
			}
			ids := make([]string, len(w.Eligible))
			for i, id := range w.Eligible {
				ids[i] = q(id)
			}
			fmt.Fprintf(&b, "    expect: [%s]\n    expect_lane: %s\n", strings.Join(ids, ", "), q(w.Lane))
			if w.RequestLane != w.Lane {
				fmt.Fprintf(&b, "    expect_request_lane: %s\n", q(w.RequestLane))
			}
		}
	}
	return []byte(b.String())
}

func (p *Policy) yaml() string {
	var b strings.Builder
	if len(p.Lanes) > 0 {
		b.WriteString("  lanes:\n")
		for _, l := range p.Lanes {
			var f []string
			if len(l.Fallback) > 0 {
				fs := make([]string, len(l.Fallback))
				for i, x := range l.Fallback {
					fs[i] = q(x)
				}
				f = append(f, "fallback: ["+strings.Join(fs, ", ")+"]")
			}
			if l.Strict {
				f = append(f, "strict: true")
			}
			if l.Expires > 0 {
				f = append(f, "expires: "+scenario.Epoch.Add(l.Expires).Format(time.RFC3339Nano))
			}
			fmt.Fprintf(&b, "    %s: {%s}\n", q(l.Lane), strings.Join(f, ", "))
		}
	}
	if len(p.Tags) > 0 {
		b.WriteString("  tags:\n")
		for _, t := range p.Tags {
			fmt.Fprintf(&b, "    - {service: %s, lane: %s", q(t.Service), q(t.Lane))
			if len(t.Addrs) > 0 {
				as := make([]string, len(t.Addrs))
				for i, a := range t.Addrs {
					as[i] = q(a)
				}
				fmt.Fprintf(&b, ", addrs: [%s]", strings.Join(as, ", "))
			} else {
				fmt.Fprintf(&b, ", labels: %s", labels(t.Labels))
			}
			if t.Disabled {
				b.WriteString(", enabled: false")
			}
			b.WriteString("}\n")
		}
	}
	if len(p.Canary) > 0 {
		b.WriteString("  canary:\n")
		for _, c := range p.Canary {
			fmt.Fprintf(&b, "    - {service: %s, lane: %s, percent: %s}\n", q(c.Service), q(c.Lane), strconv.FormatFloat(c.Percent, 'f', -1, 64))
		}
	}
	if p.Host {
		b.WriteString("  locality: {host: true}\n")
	}
	var o []string
	if p.Errors > 0 {
		o = append(o, fmt.Sprintf("errors: %d", p.Errors))
	}
	if p.Window > 0 {
		o = append(o, "window: "+p.Window.String())
	}
	if p.Ejected > 0 {
		o = append(o, "ejection: "+p.Ejected.String())
	}
	if len(o) > 0 {
		b.WriteString("  outlier: {" + strings.Join(o, ", ") + "}\n")
	}
	return b.String()
}

// q quotes s for YAML when it needs it: Go's double-quoted form is also
// YAML's for the escapes it uses.
func q(s string) string {
	plain := s != ""
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' && i > 0 || c == '.' && i > 0) {
			plain = false
			break
		}
	}
	if plain && s != "true" && s != "false" && s != "null" && s != "yes" && s != "no" && s != "on" && s != "off" {
		if _, err := strconv.ParseFloat(s, 64); err != nil {
			return s
		}
	}
	return strconv.Quote(s)
}

func opt(b *strings.Builder, name, v string) {
	if v != "" {
		fmt.Fprintf(b, ", %s: %s", name, q(v))
	}
}

func labels(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = q(k) + ": " + q(m[k])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// clone returns a deep copy of c, for the shrinker to cut.
func (c *Case) clone() *Case {
	d := *c
	d.Policy.Lanes = slices.Clone(c.Policy.Lanes)
	for i := range d.Policy.Lanes {
		d.Policy.Lanes[i].Fallback = slices.Clone(d.Policy.Lanes[i].Fallback)
	}
	d.Policy.Tags = slices.Clone(c.Policy.Tags)
	d.Policy.Canary = slices.Clone(c.Policy.Canary)
	d.Instances = slices.Clone(c.Instances)
	d.Steps = make([]Step, len(c.Steps))
	for i, st := range c.Steps {
		d.Steps[i] = Step{At: st.At}
		if st.Request != nil {
			r := *st.Request
			d.Steps[i].Request = &r
		}
		if st.Report != nil {
			r := *st.Report
			d.Steps[i].Report = &r
		}
	}
	return &d
}
