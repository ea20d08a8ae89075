package policy

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/lanesdev/lanes/internal/lib/strictyaml"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/registry"
)

// Error is a refusal of a document. It names the line (when known), the field
// and the value.
type Error = strictyaml.Error

// MaxSize is the largest policy document, in bytes: 1 MiB. Parse refuses a
// larger one, and so does every store and the admin API (413), so that what
// validates can also be stored: etcd refuses requests over 1.5 MiB by
// default.
const MaxSize = 1 << 20

// Parse decodes a YAML or JSON policy document, validates it and returns it
// normalised. name labels errors (a file name, or "" for none). Any error is
// an *Error naming the line and the field.
func Parse(name string, data []byte) (*Policy, error) {
	if len(data) > MaxSize {
		return nil, &Error{File: name, Msg: fmt.Sprintf("the document is %d bytes, more than the %d (1 MiB) a policy may have", len(data), MaxSize)}
	}
	p, lines, err := decode(data)
	if err != nil {
		if e, ok := err.(*Error); ok {
			e.File = name
		}
		return nil, err
	}
	if err := p.validate(lines); err != nil {
		err.File = name
		return nil, err
	}
	return p, nil
}

func decode(data []byte) (*Policy, strictyaml.Lines, error) {
	var p Policy
	lines, err := strictyaml.Decode(data, &p)
	if err != nil {
		return nil, nil, err
	}
	return &p, lines, nil
}

// Validate checks a policy built in Go, as Parse checks a document, and
// normalises its lane names in place.
func (p *Policy) Validate() error {
	if err := p.validate(strictyaml.Lines{}); err != nil {
		return err
	}
	return nil
}

func (p *Policy) validate(lines strictyaml.Lines) *Error {
	// Lane names: keys of lanes, fallbacks, tag and canary lanes.
	lanes := make(map[string]LaneSettings, len(p.Lanes))
	keys := make([]string, 0, len(p.Lanes))
	for k := range p.Lanes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		path := "lanes." + k
		n, err := lane.Parse(k)
		if err != nil {
			return lines.At(path, "%v", err)
		}
		if _, dup := lanes[n]; dup {
			return lines.At(path, "lane %q appears twice once normalised", n)
		}
		s := p.Lanes[k]
		fb := make([]string, len(s.Fallback))
		for i, f := range s.Fallback {
			fpath := fmt.Sprintf("%s.fallback[%d]", path, i)
			nf, err := lane.Parse(f)
			if err != nil {
				return lines.At(fpath, "%v", err)
			}
			if slices.Contains(fb[:i], nf) {
				return lines.At(fpath, "lane %q is listed twice", nf)
			}
			fb[i] = nf
		}
		s.Fallback = fb
		for i, c := range s.Clients {
			if err := checkClient(c); err != nil {
				return lines.At(fmt.Sprintf("%s.clients[%d]", path, i), "invalid client address %q: want an IP or a CIDR", c)
			}
		}
		lanes[n] = s
	}
	if len(p.Lanes) > 0 {
		p.Lanes = lanes
	}
	if cyc := fallbackCycle(p.Lanes); cyc != nil {
		path := "lanes." + cyc[0] + ".fallback"
		for k := range lines {
			// Point at the key as written, which may differ in case.
			if strings.EqualFold(k, path) {
				path = k
			}
		}
		return lines.At(path, "fallback cycle %s", strings.Join(cyc, " -> "))
	}

	for i := range p.Tags {
		t := &p.Tags[i]
		path := fmt.Sprintf("tags[%d]", i)
		if err := registry.CheckService(t.Service); err != nil {
			return lines.At(path+".service", "invalid service %q: %s", t.Service, err.(*registry.FieldError).Msg)
		}
		n, err := lane.Parse(t.Lane)
		if err != nil {
			return lines.At(path+".lane", "%v", err)
		}
		t.Lane = n
		switch {
		case len(t.Addrs) > 0 && len(t.Labels) > 0:
			return lines.At(path, "has both addrs and labels; set exactly one")
		case len(t.Addrs) == 0 && len(t.Labels) == 0:
			return lines.At(path, "has neither addrs nor labels; set exactly one")
		}
		for j, a := range t.Addrs {
			if err := checkTagAddr(a); err != nil {
				return lines.At(fmt.Sprintf("%s.addrs[%d]", path, j), "invalid address %q: %v", a, err)
			}
		}
		for k := range t.Labels {
			if k == "" {
				return lines.At(path+".labels", "empty label key")
			}
		}
	}

	type split struct{ service, lane string }
	seen := map[split]bool{}
	total := map[string]float64{}
	for i := range p.Canary {
		c := &p.Canary[i]
		path := fmt.Sprintf("canary[%d]", i)
		if err := registry.CheckService(c.Service); err != nil {
			return lines.At(path+".service", "invalid service %q: %s", c.Service, err.(*registry.FieldError).Msg)
		}
		n, err := lane.Parse(c.Lane)
		if err != nil {
			return lines.At(path+".lane", "%v", err)
		}
		c.Lane = n
		if math.IsNaN(c.Percent) || c.Percent < 0 || c.Percent > 100 {
			return lines.At(path+".percent", "percent %s is outside 0..100", strconv.FormatFloat(c.Percent, 'g', -1, 64))
		}
		if steps := c.Percent / PercentStep; math.Abs(steps-math.Round(steps)) > 1e-6 {
			return lines.At(path+".percent", "percent %s is finer than the granularity of canary splits, %s",
				strconv.FormatFloat(c.Percent, 'g', -1, 64), strconv.FormatFloat(PercentStep, 'g', -1, 64))
		}
		if seen[split{c.Service, c.Lane}] {
			return lines.At(path, "a second canary for service %q and lane %q", c.Service, c.Lane)
		}
		seen[split{c.Service, c.Lane}] = true
		total[c.Service] += c.Percent
		if total[c.Service] > 100 {
			return lines.At(path+".percent", "the canaries of service %q add up to %s%%, more than 100", c.Service, strconv.FormatFloat(total[c.Service], 'g', -1, 64))
		}
	}

	switch p.Gateway.LaneChoice {
	case "", ChoiceAll, ChoiceNone, ChoiceAllowlist:
	default:
		return lines.At("gateway.lane_choice", "unknown lane choice %q: want %s, %s or %s", p.Gateway.LaneChoice, ChoiceAll, ChoiceNone, ChoiceAllowlist)
	}
	for i, c := range p.Gateway.Allow {
		if err := checkClient(c); err != nil {
			return lines.At(fmt.Sprintf("gateway.allow[%d]", i), "invalid client address %q: want an IP or a CIDR", c)
		}
	}
	if len(p.Gateway.Allow) > 0 && p.Gateway.LaneChoice != ChoiceAllowlist {
		return lines.At("gateway.allow", "allow is used only with lane_choice: %s", ChoiceAllowlist)
	}

	o := p.Outlier
	switch {
	case o.Errors < 0 || has(lines, "outlier.errors") && o.Errors == 0:
		return lines.At("outlier.errors", "errors must be a positive count, got %d", o.Errors)
	case o.Window < 0 || has(lines, "outlier.window") && o.Window == 0:
		return lines.At("outlier.window", "window must be a positive duration, got %s", o.Window)
	case o.Ejection < 0 || has(lines, "outlier.ejection") && o.Ejection == 0:
		return lines.At("outlier.ejection", "ejection must be a positive duration, got %s", o.Ejection)
	case o.Errors > 1000:
		return lines.At("outlier.errors", "errors must be at most 1000, got %d", o.Errors)
	}
	return nil
}

func has(l strictyaml.Lines, path string) bool { _, ok := l[path]; return ok }

// checkClient accepts an IP address or a CIDR.
func checkClient(c string) error {
	if strings.Contains(c, "/") {
		_, err := netip.ParsePrefix(c)
		return err
	}
	_, err := netip.ParseAddr(c)
	return err
}

// checkTagAddr accepts host:port and *:port.
func checkTagAddr(a string) error {
	if rest, ok := strings.CutPrefix(a, "*:"); ok {
		p, err := strconv.Atoi(rest)
		if err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("port %q is not within 1..65535", rest)
		}
		return nil
	}
	return registry.CheckAddr(a)
}

// fallbackCycle returns a cycle in the fallback graph, or nil.
func fallbackCycle(lanes map[string]LaneSettings) []string {
	const (
		white = iota
		grey
		black
	)
	color := map[string]int{}
	var stack []string
	var visit func(l string) []string
	visit = func(l string) []string {
		color[l] = grey
		stack = append(stack, l)
		for _, f := range lanes[l].Fallback {
			switch color[f] {
			case grey:
				i := slices.Index(stack, f)
				return append(slices.Clone(stack[i:]), f)
			case white:
				if c := visit(f); c != nil {
					return c
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[l] = black
		return nil
	}
	keys := make([]string, 0, len(lanes))
	for k := range lanes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if color[k] == white {
			if c := visit(k); c != nil {
				return c
			}
		}
	}
	return nil
}
