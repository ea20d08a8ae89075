// Package scenario reads routing scenarios, the YAML files that `lanes
// simulate` replays, and runs them against the real routing engine with a
// virtual clock.
//
// A scenario names a policy document, a set of instances and a list of
// steps. Each step either sends a request (and may check what the engine
// answered) or reports the outcome of a call to outlier detection. The format
// is described in examples/scenarios/README.md; in short:
//
//	name: lane falls back to the baseline   # required
//	policy: {}                              # optional policy document
//	instances:                              # required, at least one
//	  - {id: o1, service: orders, addr: 10.0.0.1:8080, lane: alice, host: h1}
//	steps:                                  # required, at least one
//	  - at: 5s                              # virtual time since the start
//	    request: {service: orders, lane: alice, zone: az1, host: h1, key: k}
//	    expect: [o1]                        # eligible set, any order
//	    expect_lane: alice                  # serving lane; "" = baseline
//	  - report: {instance: o1, ok: false}
//
// Parse refuses anything that does not follow the format with a
// *strictyaml.Error naming the file, the line and the field. Run never fails:
// it returns one StepResult per step, each saying whether its expectations
// held.
package scenario

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/lanesdev/lanes/internal/lib/strictyaml"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// Limits that keep a scenario's run bounded.
const (
	// MaxSamples bounds expect_share.samples and expect_sticky.
	MaxSamples = 1_000_000
	// MaxAt bounds the virtual time of a step.
	MaxAt = 100 * 365 * 24 * time.Hour
)

// Scenario is a parsed, validated scenario.
type Scenario struct {
	File      string
	Name      string
	Policy    *policy.Policy      // nil when the scenario sets none
	Instances []registry.Instance // normalised, in file order
	Services  []string            // in order of first appearance
	Steps     []Step
}

// Step is one step of a scenario: exactly one of Request and Report is set.
type Step struct {
	Line    int           // the line the step starts on
	At      time.Duration // virtual time since the start; never decreases
	Request *Request
	Report  *Report

	// Expectations; each is checked only when set.
	Expect     []string // the eligible set, any order; nil when not set
	ExpectLane *string  // the serving lane, normalised; "" is the baseline
	// ExpectRequestLane is the lane the request carries downstream (after
	// a canary split, the canary lane); "" for none.
	ExpectRequestLane *string
	ExpectError       routing.Code
	ExpectShare       *Share
	ExpectSticky      int // 0 when not set
}

// HasExpectation reports whether the step checks anything.
func (s *Step) HasExpectation() bool {
	return s.Expect != nil || s.ExpectLane != nil || s.ExpectRequestLane != nil || s.ExpectError != "" || s.ExpectShare != nil || s.ExpectSticky > 0
}

// Request is the request a step sends.
type Request struct {
	Service string // always set, also when the file leaves it out
	Lane    string // the raw header value, as received
	Zone    string // the caller's zone
	Host    string // the caller's host
	Key     string
}

// Report is the outcome of a call, fed to outlier detection.
type Report struct {
	Service  string
	Instance string
	OK       bool
}

// Share is an expect_share expectation: of Samples requests, each with a
// fresh random key, the share served by Lane is Percent ± Tolerance.
type Share struct {
	Lane      string // normalised; "" is the baseline
	Percent   float64
	Tolerance float64
	Samples   int
}

// The document as written. Pointers tell an absent field from a zero one.
type fileDoc struct {
	Name      string     `yaml:"name"`
	Policy    yaml.Node  `yaml:"policy"`
	Instances []fileInst `yaml:"instances"`
	Steps     []fileStep `yaml:"steps"`
}

type fileInst struct {
	ID      string            `yaml:"id"`
	Service string            `yaml:"service"`
	Addr    string            `yaml:"addr"`
	Lane    string            `yaml:"lane"`
	Zone    string            `yaml:"zone"`
	Host    string            `yaml:"host"`
	Weight  *int              `yaml:"weight"`
	Labels  map[string]string `yaml:"labels"`
	Scope   string            `yaml:"scope"`
}

type fileStep struct {
	At                *time.Duration `yaml:"at"`
	Request           *fileRequest   `yaml:"request"`
	Report            *fileReport    `yaml:"report"`
	Expect            []string       `yaml:"expect"`
	ExpectLane        *string        `yaml:"expect_lane"`
	ExpectRequestLane *string        `yaml:"expect_request_lane"`
	ExpectError       string         `yaml:"expect_error"`
	ExpectShare       *fileShare     `yaml:"expect_share"`
	ExpectSticky      int            `yaml:"expect_sticky"`
}

type fileRequest struct {
	Service string `yaml:"service"`
	Lane    string `yaml:"lane"`
	Zone    string `yaml:"zone"`
	Host    string `yaml:"host"`
	Key     string `yaml:"key"`
}

type fileReport struct {
	Service  string `yaml:"service"`
	Instance string `yaml:"instance"`
	OK       *bool  `yaml:"ok"`
}

type fileShare struct {
	Lane      *string  `yaml:"lane"`
	Percent   *float64 `yaml:"percent"`
	Tolerance *float64 `yaml:"tolerance"`
	Samples   *int     `yaml:"samples"`
}

// Parse reads the scenario in data; file names it in errors. Every error is a
// *strictyaml.Error naming file, line and field.
func Parse(file string, data []byte) (*Scenario, error) {
	s, err := parse(file, data)
	if err != nil {
		if e, ok := err.(*strictyaml.Error); ok {
			e.File = file
		}
		return nil, err
	}
	return s, nil
}

// parser carries the lines of the document while it is checked.
type parser struct {
	lines strictyaml.Lines
}

func (p *parser) has(path string) bool { _, ok := p.lines[path]; return ok }

func (p *parser) errorf(path, format string, args ...any) *strictyaml.Error {
	return p.lines.At(path, format, args...)
}

func parse(file string, data []byte) (*Scenario, error) {
	var doc fileDoc
	lines, err := strictyaml.Decode(data, &doc)
	if err != nil {
		return nil, err
	}
	if lines[""] == 0 {
		lines[""] = 1 // an empty document: point at its first line
	}
	p := &parser{lines: lines}
	// The name is shown on one summary line: fold any line breaks.
	s := &Scenario{File: file, Name: strings.Join(strings.Fields(doc.Name), " ")}
	if s.Name == "" {
		return nil, p.errorf("name", "required: say in a few words what the scenario shows")
	}
	if err := p.policy(s, &doc.Policy); err != nil {
		return nil, err
	}
	if err := p.instances(s, doc.Instances); err != nil {
		return nil, err
	}
	if err := p.steps(s, doc.Steps); err != nil {
		return nil, err
	}
	return s, nil
}

func (p *parser) policy(s *Scenario, n *yaml.Node) error {
	if n.Kind == 0 || n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	prefix := func(err error) error {
		if e, ok := err.(*strictyaml.Error); ok {
			if e.Field == "" {
				e.Field = "policy"
			} else {
				e.Field = "policy." + e.Field
			}
			if e.Line == 0 {
				e.Line = p.lines["policy"]
			}
		}
		return err
	}
	// Document keeps every node on its line, so the policy parser's errors
	// point at the lines of the scenario file.
	data, err := strictyaml.Document(n)
	if err != nil {
		return prefix(err)
	}
	pol, err := policy.Parse("", data)
	if err != nil {
		return prefix(err)
	}
	s.Policy = pol
	return nil
}

func (p *parser) instances(s *Scenario, insts []fileInst) error {
	if len(insts) == 0 {
		return p.errorf("instances", "required: list at least one instance")
	}
	type key struct{ service, id string }
	seen := map[key]int{}
	for i, fi := range insts {
		path := fmt.Sprintf("instances[%d]", i)
		for _, f := range []struct{ name, v string }{{"id", fi.ID}, {"service", fi.Service}, {"addr", fi.Addr}} {
			if f.v == "" {
				return p.errorf(path+"."+f.name, "required")
			}
		}
		in := registry.Instance{
			ID: fi.ID, Service: fi.Service, Addr: fi.Addr, Lane: fi.Lane, Zone: fi.Zone, Host: fi.Host, Labels: fi.Labels, Scope: fi.Scope,
		}
		if fi.Weight != nil {
			if *fi.Weight == 0 {
				in.Drain = true // weight 0 drains the instance
			} else {
				in.Weight = *fi.Weight
			}
		}
		n, err := registry.Normalize(in)
		if err != nil {
			if fe, ok := err.(*registry.FieldError); ok {
				return p.errorf(path+"."+fe.Field, "invalid %s %q: %s", fe.Field, fe.Value, fe.Msg)
			}
			return p.errorf(path, "%v", err)
		}
		k := key{n.Service, n.ID}
		if first, dup := seen[k]; dup {
			return p.errorf(path+".id", "duplicate instance id %q in service %q (first at line %d)",
				n.ID, n.Service, p.lines[fmt.Sprintf("instances[%d]", first)])
		}
		seen[k] = i
		s.Instances = append(s.Instances, n)
		if !slices.Contains(s.Services, n.Service) {
			s.Services = append(s.Services, n.Service)
		}
	}
	return nil
}

// servicesOf returns the services that have an instance with the given id.
func (s *Scenario) servicesOf(id string) []string {
	var out []string
	for _, in := range s.Instances {
		if in.ID == id {
			out = append(out, in.Service)
		}
	}
	return out
}

func (s *Scenario) hasInstance(service, id string) bool {
	for _, in := range s.Instances {
		if in.Service == service && in.ID == id {
			return true
		}
	}
	return false
}

func (p *parser) steps(s *Scenario, steps []fileStep) error {
	if len(steps) == 0 {
		return p.errorf("steps", "required: list at least one step")
	}
	var at time.Duration
	for i := range steps {
		fs := &steps[i]
		path := fmt.Sprintf("steps[%d]", i)
		st := Step{Line: p.lines[path]}
		if fs.At != nil {
			switch {
			case *fs.At < 0:
				return p.errorf(path+".at", "negative time %s: at is the virtual time since the start", *fs.At)
			case *fs.At > MaxAt:
				return p.errorf(path+".at", "time %s is too far in the future", *fs.At)
			case *fs.At < at:
				return p.errorf(path+".at", "time goes back: %s is before %s, the time of an earlier step", *fs.At, at)
			}
			at = *fs.At
		}
		st.At = at
		hasReq, hasRep := p.has(path+".request"), p.has(path+".report")
		switch {
		case hasReq && hasRep:
			return p.errorf(path, "a step has exactly one of request and report; this one has both")
		case !hasReq && !hasRep:
			return p.errorf(path, "a step has exactly one of request and report; this one has neither")
		case hasRep:
			for _, f := range expectFields {
				if p.has(path + "." + f) {
					return p.errorf(path+"."+f, "a report step takes no expectation; put it on a request step")
				}
			}
			r, err := p.report(s, fs.Report, path+".report")
			if err != nil {
				return err
			}
			st.Report = r
		default:
			r, err := p.request(s, fs.Request, path+".request")
			if err != nil {
				return err
			}
			st.Request = r
			if err := p.expectations(s, fs, &st, path); err != nil {
				return err
			}
		}
		s.Steps = append(s.Steps, st)
	}
	return nil
}

// expectFields are the keys of a step's expectations.
var expectFields = []string{"expect", "expect_lane", "expect_request_lane", "expect_error", "expect_share", "expect_sticky"}

func (p *parser) report(s *Scenario, fr *fileReport, path string) (*Report, error) {
	if fr == nil {
		return nil, p.errorf(path, "want a mapping such as {instance: o1, ok: false}")
	}
	if fr.Instance == "" {
		return nil, p.errorf(path+".instance", "required: the id of the instance the call went to")
	}
	if fr.OK == nil {
		return nil, p.errorf(path+".ok", "required: true for a successful call, false for a failed one")
	}
	r := &Report{Instance: fr.Instance, OK: *fr.OK, Service: fr.Service}
	if r.Service != "" {
		if !slices.Contains(s.Services, r.Service) {
			return nil, p.errorf(path+".service", "unknown service %q; the scenario has %s", r.Service, strings.Join(s.Services, ", "))
		}
		if !s.hasInstance(r.Service, r.Instance) {
			return nil, p.errorf(path+".instance", "unknown instance %q of service %q", r.Instance, r.Service)
		}
		return r, nil
	}
	switch svcs := s.servicesOf(r.Instance); len(svcs) {
	case 0:
		return nil, p.errorf(path+".instance", "unknown instance %q: no instance of the scenario has this id", r.Instance)
	case 1:
		r.Service = svcs[0]
	default:
		return nil, p.errorf(path+".instance", "instance id %q is used by several services (%s); add service", r.Instance, strings.Join(svcs, ", "))
	}
	return r, nil
}

func (p *parser) request(s *Scenario, fr *fileRequest, path string) (*Request, error) {
	if fr == nil {
		fr = &fileRequest{} // "request:" with no value is the empty request
	}
	r := &Request{Service: fr.Service, Lane: fr.Lane, Zone: fr.Zone, Host: fr.Host, Key: fr.Key}
	// The caller's zone and host follow the rule of the registry's fields.
	for _, f := range []struct{ name, v string }{{"zone", r.Zone}, {"host", r.Host}} {
		if len(f.v) > 253 || strings.ContainsAny(f.v, "\x00\r\n") {
			return nil, p.errorf(path+"."+f.name, "invalid %s %q: must be at most 253 printable characters", f.name, f.v)
		}
	}
	if r.Service == "" {
		if p.has(path + ".service") {
			return nil, p.errorf(path+".service", "empty service")
		}
		if len(s.Services) > 1 {
			return nil, p.errorf(path, "service is required: the scenario has several services (%s)", strings.Join(s.Services, ", "))
		}
		r.Service = s.Services[0]
	} else if !slices.Contains(s.Services, r.Service) {
		return nil, p.errorf(path+".service", "unknown service %q; the scenario has %s", r.Service, strings.Join(s.Services, ", "))
	}
	return r, nil
}

func (p *parser) expectations(s *Scenario, fs *fileStep, st *Step, path string) error {
	svc := st.Request.Service
	if p.has(path + ".expect") {
		st.Expect = []string{}
		for j, id := range fs.Expect {
			ip := fmt.Sprintf("%s.expect[%d]", path, j)
			if !s.hasInstance(svc, id) {
				return p.errorf(ip, "unknown instance %q: not an instance of service %q", id, svc)
			}
			if slices.Contains(st.Expect, id) {
				return p.errorf(ip, "instance %q is listed twice", id)
			}
			st.Expect = append(st.Expect, id)
		}
		if len(st.Expect) == 0 {
			return p.errorf(path+".expect", "an empty eligible set is an error: use expect_error")
		}
	}
	if p.has(path + ".expect_lane") {
		if fs.ExpectLane == nil {
			return p.errorf(path+".expect_lane", `want a lane name, or "" for the baseline`)
		}
		l, err := normLane(*fs.ExpectLane)
		if err != nil {
			return p.errorf(path+".expect_lane", "%v", err)
		}
		st.ExpectLane = &l
	}
	if p.has(path + ".expect_request_lane") {
		if fs.ExpectRequestLane == nil {
			return p.errorf(path+".expect_request_lane", `want a lane name, or "" for none`)
		}
		l, err := normLane(*fs.ExpectRequestLane)
		if err != nil {
			return p.errorf(path+".expect_request_lane", "%v", err)
		}
		st.ExpectRequestLane = &l
	}
	if p.has(path + ".expect_error") {
		switch c := routing.Code(fs.ExpectError); c {
		case routing.CodeNoInstance, routing.CodeLaneUnavailable:
			st.ExpectError = c
		default:
			return p.errorf(path+".expect_error", "unknown error %q: want %s or %s", fs.ExpectError, routing.CodeNoInstance, routing.CodeLaneUnavailable)
		}
		for _, f := range []string{"expect", "expect_lane", "expect_request_lane"} {
			if p.has(path + "." + f) {
				return p.errorf(path+"."+f, "contradicts expect_error: a failed request has no eligible set and no lane")
			}
		}
	}
	if p.has(path + ".expect_share") {
		sh, err := p.share(fs.ExpectShare, path+".expect_share")
		if err != nil {
			return err
		}
		st.ExpectShare = sh
		for _, f := range expectFields {
			if f != "expect_share" && p.has(path+"."+f) {
				return p.errorf(path+"."+f, "cannot be combined with expect_share, which sends many requests with random keys")
			}
		}
		if p.has(path + ".request.key") {
			return p.errorf(path+".request.key", "expect_share gives each request a fresh random key; leave key out")
		}
	}
	if p.has(path + ".expect_sticky") {
		n := fs.ExpectSticky
		if n < 1 || n > MaxSamples {
			return p.errorf(path+".expect_sticky", "want a number of requests within 1..%d, got %d", MaxSamples, n)
		}
		st.ExpectSticky = n
		if p.has(path + ".expect_error") {
			return p.errorf(path+".expect_sticky", "contradicts expect_error: failed requests are served by no lane")
		}
	}
	return nil
}

func (p *parser) share(fs *fileShare, path string) (*Share, error) {
	if fs == nil {
		return nil, p.errorf(path, "want a mapping {lane, percent, tolerance, samples}")
	}
	switch {
	case fs.Lane == nil:
		return nil, p.errorf(path+".lane", `required: the lane whose share is checked ("" for the baseline)`)
	case fs.Percent == nil:
		return nil, p.errorf(path+".percent", "required: the expected share, 0..100")
	case fs.Tolerance == nil:
		return nil, p.errorf(path+".tolerance", "required: how far the share may be from percent, in points")
	case fs.Samples == nil:
		return nil, p.errorf(path+".samples", "required: how many requests to send")
	}
	l, err := normLane(*fs.Lane)
	if err != nil {
		return nil, p.errorf(path+".lane", "%v", err)
	}
	sh := &Share{Lane: l, Percent: *fs.Percent, Tolerance: *fs.Tolerance, Samples: *fs.Samples}
	switch {
	case sh.Percent < 0 || sh.Percent > 100:
		return nil, p.errorf(path+".percent", "percent %g is outside 0..100", sh.Percent)
	case sh.Tolerance < 0 || sh.Tolerance > 100:
		return nil, p.errorf(path+".tolerance", "tolerance %g is outside 0..100", sh.Tolerance)
	case sh.Samples < 1 || sh.Samples > MaxSamples:
		return nil, p.errorf(path+".samples", "want a number of requests within 1..%d, got %d", MaxSamples, sh.Samples)
	}
	return sh, nil
}

// normLane normalises an expected lane: "" is the baseline.
func normLane(raw string) (string, error) {
	if raw == "" {
		return "", nil
	}
	return lane.Parse(raw)
}
