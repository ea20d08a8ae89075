package scenario

import (
	"bytes"
	"errors"
	"fmt"
	"sort"

	"go.yaml.in/yaml/v3"

	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// The document as Encode writes it: the fields of fileDoc, empty ones left
// out.
type outDoc struct {
	Name      string     `yaml:"name"`
	Policy    *yaml.Node `yaml:"policy,omitempty"`
	Instances []outInst  `yaml:"instances"`
	Steps     []outStep  `yaml:"steps"`
}

type outInst struct {
	ID      string            `yaml:"id"`
	Service string            `yaml:"service"`
	Addr    string            `yaml:"addr"`
	Lane    string            `yaml:"lane,omitempty"`
	Zone    string            `yaml:"zone,omitempty"`
	Host    string            `yaml:"host,omitempty"`
	Weight  *int              `yaml:"weight,omitempty"`
	Labels  map[string]string `yaml:"labels,omitempty"`
	Scope   string            `yaml:"scope,omitempty"`
}

type outStep struct {
	Request           outRequest `yaml:"request"`
	Expect            []string   `yaml:"expect,omitempty"`
	ExpectLane        *string    `yaml:"expect_lane,omitempty"`
	ExpectRequestLane *string    `yaml:"expect_request_lane,omitempty"`
	ExpectError       string     `yaml:"expect_error,omitempty"`
}

type outRequest struct {
	Service string `yaml:"service"`
	Lane    string `yaml:"lane,omitempty"`
}

// FromFleet makes a scenario of a fleet and a policy document (raw, YAML or
// JSON; nil for none): the instances, the policy, and one request step per
// service and lane (every lane of the instances and of the policy, and the
// baseline) whose expectations are the routing engine's answers under
// expectWith (the policy in force, typically; nil for the empty policy).
// Replaying it passes; replaying it with another policy fails at the routes
// that policy changes.
func FromFleet(name string, raw []byte, expectWith *policy.Policy, insts []registry.Instance) ([]byte, error) {
	doc := outDoc{Name: name}
	if len(bytes.TrimSpace(raw)) > 0 {
		var n yaml.Node
		if err := yaml.Unmarshal(raw, &n); err != nil {
			return nil, fmt.Errorf("policy: %w", err)
		}
		if len(n.Content) == 1 {
			doc.Policy = n.Content[0]
		}
	}
	bySvc := map[string][]registry.Instance{}
	lanes := map[string]bool{"": true}
	for _, in := range insts {
		w := in.Weight
		oi := outInst{ID: in.ID, Service: in.Service, Addr: in.Addr, Lane: in.Lane, Zone: in.Zone, Host: in.Host, Labels: in.Labels, Scope: in.Scope}
		if in.Drain || (w != 0 && w != registry.DefaultWeight) {
			oi.Weight = &w
		}
		doc.Instances = append(doc.Instances, oi)
		bySvc[in.Service] = append(bySvc[in.Service], in)
		lanes[in.Lane] = true
	}
	if expectWith == nil {
		expectWith = &policy.Policy{}
	}
	for l := range expectWith.Lanes {
		lanes[l] = true
	}
	for _, t := range expectWith.Tags {
		lanes[t.Lane] = true
	}
	e := routing.New()
	defer e.Close()
	e.SetPolicy(expectWith)
	var svcs, ls []string
	for s := range bySvc {
		svcs = append(svcs, s)
	}
	for l := range lanes {
		ls = append(ls, l)
	}
	sort.Strings(svcs)
	sort.Strings(ls)
	for _, s := range svcs {
		e.SetInstances(s, bySvc[s])
		svc := e.Service(s)
		for _, l := range ls {
			st := outStep{Request: outRequest{Service: s, Lane: l}}
			d, err := svc.Resolve(routing.Request{Lane: l})
			var re *routing.Error
			if errors.As(err, &re) {
				st.ExpectError = string(re.Code)
			} else if err != nil {
				return nil, err
			} else {
				ids := append([]string(nil), d.Eligible...)
				sort.Strings(ids)
				lane := d.Lane
				st.Expect, st.ExpectLane = ids, &lane
			}
			doc.Steps = append(doc.Steps, st)
		}
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	enc.Close()
	return b.Bytes(), nil
}
