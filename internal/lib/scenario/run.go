package scenario

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// Epoch is the wall-clock reading of the virtual clock at `at: 0s`.
var Epoch = time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC)

// Options tune Run. The zero value is the default.
type Options struct {
	// Seed is mixed into the seeds of the random keys that expect_share
	// sends. Each step's keys are derived from the scenario name, the step
	// number and Seed, so that the same file gives the same answers on
	// every run and in every directory.
	Seed uint64
	// AfterRequest, when set, is called after each request step has been
	// answered, with its service, its request as the engine took it and
	// its result: a test can ask the engine more there (Pick, the
	// transports' path) while its state is the step's.
	AfterRequest func(svc *routing.Service, req routing.Request, res StepResult)
}

// Result is the outcome of one scenario.
type Result struct {
	File  string
	Name  string
	Steps []StepResult
}

// OK reports whether every expectation held.
func (r *Result) OK() bool { return len(r.Failures()) == 0 }

// Failures returns the steps whose expectations did not hold.
func (r *Result) Failures() []StepResult {
	var out []StepResult
	for _, s := range r.Steps {
		if !s.OK {
			out = append(out, s)
		}
	}
	return out
}

// StepResult is what happened at one step. Its JSON form is the line that
// `lanes simulate --json` prints.
type StepResult struct {
	File string `json:"file"`
	Step int    `json:"step"` // from 1
	Line int    `json:"-"`    // the line the step starts on
	// Lane is the request lane as the step sent it (the raw header value);
	// "" for a baseline request and for a report step.
	Lane string `json:"lane"`
	// Eligible is the eligible set the engine answered; empty, never nil,
	// for a failed request and for a report step.
	Eligible []string `json:"eligible"`
	// ServingLane is the lane that served ("" for the baseline).
	ServingLane string `json:"-"`
	// RequestLane is the lane the request carries downstream: its own, the
	// canary lane of a split, or "" for none.
	RequestLane string `json:"-"`
	// Error is the engine's error code ("no_instance", "lane_unavailable"),
	// or "".
	Error string `json:"error"`
	// Reason is the engine's reason for its answer (see routing.Reason), or
	// "" for a failed request and for a report step.
	Reason string `json:"reason"`
	OK     bool   `json:"ok"`
	// Message says, for a failed step, what was expected and what the engine
	// answered.
	Message string `json:"message,omitempty"`
}

// For steps that send many requests (expect_share, expect_sticky), Lane,
// Eligible, Error and Reason describe the first one.

// Run replays s against a new routing engine driven by a virtual clock and
// checks every expectation. It does not stop at a failed step.
func Run(s *Scenario, opts Options) Result {
	clock := routing.NewManualClock(Epoch)
	e := routing.New(routing.WithClock(clock), routing.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	defer e.Close()
	e.SetPolicy(s.Policy)
	by := map[string][]registry.Instance{}
	for _, in := range s.Instances {
		by[in.Service] = append(by[in.Service], in)
	}
	for _, svc := range s.Services {
		e.SetInstances(svc, by[svc])
	}
	res := Result{File: s.File, Name: s.Name, Steps: make([]StepResult, 0, len(s.Steps))}
	for i := range s.Steps {
		st := &s.Steps[i]
		clock.Set(Epoch.Add(st.At))
		r := StepResult{File: s.File, Step: i + 1, Line: st.Line, Eligible: []string{}, OK: true}
		if st.Report != nil {
			e.Service(st.Report.Service).ReportID(st.Report.Instance, st.Report.OK)
		} else {
			svc := e.Service(st.Request.Service)
			runRequest(svc, st, &r, stepSeed(s.Name, i, opts.Seed))
			if opts.AfterRequest != nil {
				opts.AfterRequest(svc, st.Request.Routing(), r)
			}
		}
		res.Steps = append(res.Steps, r)
	}
	return res
}

func stepSeed(name string, step int, seed uint64) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write([]byte(strconv.Itoa(step)))
	return h.Sum64() ^ seed
}

// answer is the engine's answer to one request.
type answer struct {
	d   routing.Decision
	err error
}

func (a answer) code() routing.Code {
	var re *routing.Error
	if errors.As(a.err, &re) {
		return re.Code
	}
	if a.err != nil {
		return routing.Code(a.err.Error())
	}
	return ""
}

// describe says what the engine answered, with its reason.
func (a answer) describe() string {
	if a.err != nil {
		return fmt.Sprintf("%s (%s)", a.code(), strings.TrimPrefix(a.err.Error(), string(a.code())+": "))
	}
	return fmt.Sprintf("%s from %s (reason %s)", idList(a.d.Eligible), laneName(a.d.Lane), a.d.Reason)
}

// engineLane turns a raw header value into Request.Lane: a valid lane is
// normalised; an invalid one is passed on as it is, so that the engine routes
// it as a baseline request and counts it (reason "invalid-lane"); an empty
// one, or one of spaces and tabs alone, is no lane at all. Other whitespace
// (a line feed) is not trimmed, as lane.Parse does not trim it: it makes
// the value an invalid lane, as at a transport.
func engineLane(raw string) string {
	if strings.Trim(raw, " \t") == "" {
		return ""
	}
	if l, err := lane.Parse(raw); err == nil {
		return l
	}
	return raw
}

// Routing returns the request as the engine takes it.
func (r *Request) Routing() routing.Request {
	return routing.Request{Lane: engineLane(r.Lane), Zone: r.Zone, Host: r.Host, Key: r.Key}
}

func runRequest(svc *routing.Service, st *Step, r *StepResult, seed uint64) {
	req := st.Request.Routing()
	r.Lane = st.Request.Lane
	send := func(req routing.Request) answer {
		d, err := svc.Resolve(req)
		return answer{d, err}
	}
	var fails []string
	fail := func(format string, args ...any) { fails = append(fails, fmt.Sprintf(format, args...)) }

	var first answer
	switch {
	case st.ExpectShare != nil:
		sh := st.ExpectShare
		rng := rand.New(rand.NewPCG(seed, 0x6c616e6573))
		served := 0
		for i := 0; i < sh.Samples; i++ {
			req.Key = "k" + strconv.FormatUint(rng.Uint64(), 36)
			a := send(req)
			if i == 0 {
				first = a
			}
			if a.err == nil && a.d.Lane == sh.Lane {
				served++
			}
		}
		got := 100 * float64(served) / float64(sh.Samples)
		if got < sh.Percent-sh.Tolerance-1e-9 || got > sh.Percent+sh.Tolerance+1e-9 {
			fail("expected %s to serve %g%% ± %g of %d requests with random keys, engine answered %.2f%% (%d of %d; first request: %s)",
				laneName(sh.Lane), sh.Percent, sh.Tolerance, sh.Samples, got, served, sh.Samples, first.describe())
		}
	default:
		first = send(req)
		checkOne(st, first, fail)
		if st.ExpectSticky > 0 {
			counts := map[string]int{}
			var order []string
			for i := 0; i < st.ExpectSticky; i++ {
				a := first
				if i > 0 {
					a = send(req)
				}
				k := laneName(a.d.Lane)
				if a.err != nil {
					k = string(a.code())
				}
				if counts[k] == 0 {
					order = append(order, k)
				}
				counts[k]++
			}
			if len(order) > 1 || first.err != nil {
				parts := make([]string, len(order))
				for i, k := range order {
					parts[i] = fmt.Sprintf("%s %d times", k, counts[k])
				}
				key := "no key"
				if req.Key != "" {
					key = "key " + strconv.Quote(req.Key)
				}
				fail("expected %d requests with %s to be served by one lane, engine answered %s (first request: %s)",
					st.ExpectSticky, key, strings.Join(parts, ", "), first.describe())
			}
		}
	}

	if first.err != nil {
		r.Error = string(first.code())
	} else {
		r.Eligible = append(r.Eligible, first.d.Eligible...)
		r.ServingLane = first.d.Lane
		r.RequestLane = first.d.RequestLane
		r.Reason = first.d.Reason.String()
	}
	if len(fails) > 0 {
		r.OK = false
		r.Message = strings.Join(fails, "; ")
	}
}

// checkOne checks expect, expect_lane and expect_error against one answer.
func checkOne(st *Step, a answer, fail func(string, ...any)) {
	if st.ExpectError != "" {
		if a.code() != st.ExpectError {
			fail("expected error %s, engine answered %s", st.ExpectError, a.describe())
		}
		return
	}
	if st.Expect != nil {
		if a.err != nil || !sameSet(st.Expect, a.d.Eligible) {
			fail("expected eligible %s, engine answered %s", idList(st.Expect), a.describe())
		}
	}
	if st.ExpectLane != nil {
		if a.err != nil || a.d.Lane != *st.ExpectLane {
			fail("expected %s to serve, engine answered %s", laneName(*st.ExpectLane), a.describe())
		}
	}
	if st.ExpectRequestLane != nil {
		if a.err != nil || a.d.RequestLane != *st.ExpectRequestLane {
			got := a.describe()
			if a.err == nil {
				got = fmt.Sprintf("%s, carrying %s (reason %s)", idList(a.d.Eligible), carried(a.d.RequestLane), a.d.Reason)
			}
			fail("expected the request to carry %s downstream, engine answered %s", carried(*st.ExpectRequestLane), got)
		}
	}
}

func sameSet(want, got []string) bool {
	if len(want) != len(got) {
		return false
	}
	w, g := slices.Clone(want), slices.Clone(got)
	slices.Sort(w)
	slices.Sort(g)
	return slices.Equal(w, g)
}

func idList(ids []string) string { return "[" + strings.Join(ids, ", ") + "]" }

// carried names the lane a request carries downstream, for messages.
func carried(l string) string {
	if l == "" {
		return "no lane"
	}
	return "lane " + l
}

// laneName names a serving lane for messages.
func laneName(l string) string {
	if l == "" {
		return "the baseline"
	}
	return "lane " + l
}
