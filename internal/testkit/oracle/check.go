package oracle

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lanesdev/lanes/internal/lib/scenario"
	"github.com/lanesdev/lanes/routing"
)

// Path is a data path under test: it replays a parsed scenario and returns
// one answer per step (the zero Answer for a report step).
type Path func(s *scenario.Scenario) []Answer

// Engine is the routing engine, driven as `lanes simulate` drives it
// (scenario.Run: a new engine on a virtual clock, Service.Resolve for each
// request, ReportID for each report).
func Engine(s *scenario.Scenario) []Answer { return EngineAnd(nil)(s) }

// EngineAnd is Engine with a check of the engine's own after each request
// step (scenario.Options.AfterRequest): what check finds wrong ("" for
// nothing) is the step's Problem, which the model never has.
func EngineAnd(check func(svc *routing.Service, req routing.Request, res scenario.StepResult) string) Path {
	return func(s *scenario.Scenario) []Answer {
		problems := map[int]string{}
		retries := map[int][]Answer{}
		opts := scenario.Options{AfterRequest: func(svc *routing.Service, req routing.Request, res scenario.StepResult) {
			if check != nil {
				if p := check(svc, req, res); p != "" {
					problems[res.Step-1] = p
				}
			}
			// The retries, by the pick of a retry (PickWithout).
			step := Answer{Eligible: slices.Sorted(slices.Values(res.Eligible)), Error: res.Error, Reason: res.Reason}
			for _, failed := range step.RetrySets() {
				var a Answer
				r, err := svc.PickWithout(req, failed...)
				var re *routing.Error
				switch {
				case errors.As(err, &re):
					a.Error = string(re.Code)
				case err != nil:
					a.Error = err.Error()
				default:
					a = Answer{Eligible: []string{r.Instance.ID}, Lane: r.Lane, RequestLane: r.RequestLane, Reason: r.Reason.String()}
				}
				retries[res.Step-1] = append(retries[res.Step-1], a)
			}
		}}
		res := scenario.Run(s, opts)
		out := make([]Answer, len(s.Steps))
		for i, r := range res.Steps {
			if s.Steps[i].Report != nil {
				continue
			}
			a := Answer{Error: r.Error, Problem: problems[i], Retries: retries[i]}
			if r.Error == "" {
				a.Eligible = slices.Sorted(slices.Values(r.Eligible))
				a.Lane, a.RequestLane, a.Reason = r.ServingLane, r.RequestLane, r.Reason
			}
			out[i] = a
		}
		return out
	}
}

// Replay runs the model over a parsed scenario: the contract's answer to
// each step.
func Replay(s *scenario.Scenario) []Answer {
	m := New(s.Policy, s.Instances, scenario.Epoch)
	out := make([]Answer, len(s.Steps))
	for i, st := range s.Steps {
		m.At(scenario.Epoch.Add(st.At))
		if r := st.Report; r != nil {
			m.Report(r.Service, r.Instance, r.OK)
			continue
		}
		req := requestOf(st.Request)
		a := m.Resolve(req)
		for _, failed := range a.RetrySets() {
			a.Retries = append(a.Retries, m.ResolveWithout(req, failed))
		}
		out[i] = a
	}
	return out
}

// requestOf is a scenario step's request as the model takes it.
func requestOf(r *scenario.Request) Request {
	return Request{Service: r.Service, Lane: r.Lane, Zone: r.Zone, Host: r.Host, Key: r.Key}
}

// Keeps says which parts of an answer a data path claims to keep. The
// engine keeps them all; a data path that cannot say why (the reason) or
// what travels on is compared on the rest.
type Keeps uint8

const (
	KeepsEligible    Keeps = 1 << iota // the eligible set, or the error code
	KeepsLane                          // the serving lane
	KeepsRequestLane                   // the lane carried downstream
	KeepsReason                        // the reason
	KeepsRetries                       // the retries of a failed call, along the lane chain
	KeepsAll         = KeepsEligible | KeepsLane | KeepsRequestLane | KeepsReason | KeepsRetries
)

// Disagreement is a step where a data path and the model differ.
type Disagreement struct {
	Step    int // from 1
	Line    int // in the rendered scenario
	Request Request
	Path    Answer
	Model   Answer
}

func (d *Disagreement) Error() string {
	return fmt.Sprintf("step %d (line %d), request %+v: the path answered %s, the model %s",
		d.Step, d.Line, d.Request, d.Path, d.Model)
}

func (a Answer) String() string {
	if a.Problem != "" {
		return a.answer() + "; but " + a.Problem
	}
	return a.answer()
}

func (a Answer) answer() string {
	if len(a.Retries) > 0 {
		r := a
		r.Retries = nil
		var rs []string
		for i, x := range a.Retries {
			rs = append(rs, fmt.Sprintf("without %v: %s", a.Eligible[:i+1], x))
		}
		return r.answer() + "; retries: " + strings.Join(rs, "; ")
	}
	if a.Error != "" {
		return a.Error
	}
	lane := "the baseline"
	if a.Lane != "" {
		lane = "lane " + a.Lane
	}
	return fmt.Sprintf("[%s] from %s, carrying %q (reason %s)", strings.Join(a.Eligible, ", "), lane, a.RequestLane, a.Reason)
}

// Counts are what checks compared: the steps, and the model's answers by
// reason or error code, to show that the generator reaches every rule.
type Counts struct {
	Requests, Reports, Retries int
	Answers                    map[string]int // by reason, or by error code
}

// Add adds o to n.
func (n *Counts) Add(o Counts) {
	n.Requests += o.Requests
	n.Reports += o.Reports
	n.Retries += o.Retries
	for k, v := range o.Answers {
		if n.Answers == nil {
			n.Answers = map[string]int{}
		}
		n.Answers[k] += v
	}
}

// Check renders c, parses it as `lanes simulate` does, replays it through
// path and through the model, and returns the first step where they
// disagree on what path keeps (nil when none). It fails only when c does
// not render to a valid scenario.
func Check(path Path, keeps Keeps, c *Case) (*Disagreement, Counts, error) {
	s, err := scenario.Parse(c.Name+".yaml", c.YAML())
	if err != nil {
		return nil, Counts{}, err
	}
	got, want := path(s), Replay(s)
	n := Counts{Answers: map[string]int{}}
	for i, st := range s.Steps {
		if st.Report != nil {
			n.Reports++
			continue
		}
		n.Requests++
		n.Answers[want[i].Reason+want[i].Error]++
		for _, r := range want[i].Retries {
			n.Retries++
			n.Answers["retry "+r.Reason+r.Error]++
		}
		if !agree(got[i], want[i], keeps) {
			return &Disagreement{Step: i + 1, Line: st.Line, Request: requestOf(st.Request),
				Path: got[i], Model: want[i]}, n, nil
		}
	}
	return nil, n, nil
}

func agree(got, want Answer, keeps Keeps) bool {
	if got.Problem != "" || !agreeOne(got, want, keeps, slices.Equal[[]string]) || len(got.Retries) != len(want.Retries) && keeps&KeepsRetries != 0 {
		return false
	}
	if keeps&KeepsRetries != 0 {
		for i := range got.Retries {
			// A retry's pick is one instance of the model's eligible set.
			if !agreeOne(got.Retries[i], want.Retries[i], keeps, func(pick, set []string) bool { return len(pick) == 1 && slices.Contains(set, pick[0]) }) {
				return false
			}
		}
	}
	return true
}

func agreeOne(got, want Answer, keeps Keeps, sameSet func(got, want []string) bool) bool {
	if got.Error != "" || want.Error != "" {
		return keeps&KeepsEligible == 0 || got.Error == want.Error
	}
	return (keeps&KeepsEligible == 0 || sameSet(got.Eligible, want.Eligible)) &&
		(keeps&KeepsLane == 0 || got.Lane == want.Lane) &&
		(keeps&KeepsRequestLane == 0 || got.RequestLane == want.RequestLane) &&
		(keeps&KeepsReason == 0 || got.Reason == want.Reason)
}

// Shrink cuts a case on which path disagrees with the model down to one
// where no single cut (a step, an instance, a part of the policy, a field,
// a stretch of time) keeps a disagreement. It returns the smallest case
// found, which still disagrees.
func Shrink(path Path, keeps Keeps, c *Case) *Case {
	fails := func(c *Case) bool {
		d, _, err := Check(path, keeps, c)
		return err == nil && d != nil
	}
	if !fails(c) {
		return c
	}
	for {
		cut := false
		for _, try := range cuts(c) {
			if d := try(); d != nil && fails(d) {
				c, cut = d, true
				break
			}
		}
		if !cut {
			return c
		}
	}
}

// cuts lists the ways to make c smaller, each a function that returns the
// smaller case (or nil where it does not apply).
func cuts(c *Case) []func() *Case {
	var out []func() *Case
	edit := func(f func(d *Case) bool) {
		out = append(out, func() *Case {
			d := c.clone()
			if !f(d) {
				return nil
			}
			return d
		})
	}
	// Whole steps, last first: what follows a disagreement never matters.
	for i := len(c.Steps) - 1; i >= 0; i-- {
		edit(func(d *Case) bool { d.Steps = slices.Delete(d.Steps, i, i+1); return len(d.Steps) > 0 })
	}
	// Whole instances, with the reports on them.
	for i := range c.Instances {
		edit(func(d *Case) bool {
			gone := d.Instances[i]
			d.Instances = slices.Delete(d.Instances, i, i+1)
			d.Steps = slices.DeleteFunc(d.Steps, func(st Step) bool {
				return st.Report != nil && st.Report.Service == gone.Service && st.Report.Instance == gone.ID
			})
			return len(d.Instances) > 0 && len(d.Steps) > 0
		})
	}
	// The policy, part by part.
	p := &c.Policy
	for i := range p.Lanes {
		edit(func(d *Case) bool { d.Policy.Lanes = slices.Delete(d.Policy.Lanes, i, i+1); return true })
		for j := range p.Lanes[i].Fallback {
			edit(func(d *Case) bool {
				d.Policy.Lanes[i].Fallback = slices.Delete(d.Policy.Lanes[i].Fallback, j, j+1)
				return true
			})
		}
		edit(func(d *Case) bool { l := &d.Policy.Lanes[i]; was := l.Strict; l.Strict = false; return was })
		edit(func(d *Case) bool { l := &d.Policy.Lanes[i]; was := l.Expires; l.Expires = 0; return was != 0 })
	}
	for i := range p.Tags {
		edit(func(d *Case) bool { d.Policy.Tags = slices.Delete(d.Policy.Tags, i, i+1); return true })
	}
	for i := range p.Canary {
		edit(func(d *Case) bool { d.Policy.Canary = slices.Delete(d.Policy.Canary, i, i+1); return true })
	}
	edit(func(d *Case) bool { was := d.Policy.Host; d.Policy.Host = false; return was })
	edit(func(d *Case) bool {
		was := d.Policy.Errors != 0 || d.Policy.Window != 0 || d.Policy.Ejected != 0
		d.Policy.Errors, d.Policy.Window, d.Policy.Ejected = 0, 0, 0
		return was
	})
	// Fields of instances and requests.
	for i := range c.Instances {
		for _, f := range []func(in *Instance) bool{
			func(in *Instance) bool { was := in.Lane; in.Lane = ""; return was != "" },
			func(in *Instance) bool { was := in.Zone; in.Zone = ""; return was != "" },
			func(in *Instance) bool { was := in.Host; in.Host = ""; return was != "" },
			func(in *Instance) bool { was := in.Weight; in.Weight = -1; return was != -1 },
			func(in *Instance) bool { was := in.Labels; in.Labels = nil; return was != nil },
			func(in *Instance) bool { was := in.Scope; in.Scope = ""; return was != "" },
		} {
			edit(func(d *Case) bool { return f(&d.Instances[i]) })
		}
	}
	for i, st := range c.Steps {
		if st.Request == nil {
			continue
		}
		for _, f := range []func(r *Request) bool{
			func(r *Request) bool { was := r.Lane; r.Lane = ""; return was != "" },
			func(r *Request) bool { was := r.Zone; r.Zone = ""; return was != "" },
			func(r *Request) bool { was := r.Host; r.Host = ""; return was != "" },
			// A baseline request without a key splits at random where
			// canaries are in force: keys go only once the canaries have.
			func(r *Request) bool { was := r.Key; r.Key = ""; return was != "" && len(c.Policy.Canary) == 0 },
		} {
			edit(func(d *Case) bool { return f(d.Steps[i].Request) })
		}
	}
	// Time: close each gap between steps, or halve it.
	for i := range c.Steps {
		gap := c.Steps[i].At
		if i > 0 {
			gap -= c.Steps[i-1].At
		}
		for _, by := range []time.Duration{gap, gap / 2} {
			edit(func(d *Case) bool {
				if by <= 0 {
					return false
				}
				for j := i; j < len(d.Steps); j++ {
					d.Steps[j].At -= by
				}
				return true
			})
		}
	}
	return out
}

// Print renders c with the model's answer to each request step as its
// expectations: a scenario file that `lanes simulate` passes once the data
// path keeps the contract, ready to keep as a regression case.
func Print(c *Case) ([]byte, error) {
	s, err := scenario.Parse(c.Name+".yaml", c.YAML())
	if err != nil {
		return nil, err
	}
	want := Replay(s)
	d := c.clone()
	for i := range d.Steps {
		if d.Steps[i].Request != nil {
			w := want[i]
			d.Steps[i].Want = &w
		}
	}
	return d.YAML(), nil
}
