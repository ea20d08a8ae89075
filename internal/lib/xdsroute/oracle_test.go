package xdsroute_test

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/lanesdev/lanes/internal/lib/scenario"
	"github.com/lanesdev/lanes/internal/lib/xdsroute"
	"github.com/lanesdev/lanes/internal/testkit/oracle"
)

// The translation against the reference model of the contract
// (internal/testkit/oracle): random fleets, policies and requests, each
// request translated for its caller at its time and evaluated on the
// resources as a gRPC client reads them (evaluator), compared with the
// model on what xDS can express: the eligible set (or the error) and the
// serving lane.
//
// What xDS cannot express is left out of the cases, and listed in
// docs/xds.md: outcome reports (gRPC's outlier detection is the client's
// own, and so are the probes and the baseline's panic mode), the lane a
// request carries on (the service's to propagate), retries along the chain,
// and the stickiness of canary splits (a client draws at random; the
// evaluator draws by the key, to check the weights).

var differentialScenarios = flag.Int("oracle.scenarios", 500, "random scenarios TestDifferential runs")

const keeps = oracle.KeepsEligible | oracle.KeepsLane

func TestDifferential(t *testing.T) {
	n := *differentialScenarios
	if testing.Short() {
		n /= 5
	}
	var total oracle.Counts
	compared := 0
	for seed := range uint64(n) {
		c := expressible(oracle.Generate(oracle.Seeded(seed), fmt.Sprintf("xds seed %d", seed), 2+int(seed%7)))
		if c == nil {
			continue // only outcome reports
		}
		compared++
		d, counts, err := oracle.Check(xdsPath(t), keeps, c)
		if err != nil {
			t.Fatalf("seed %d: the generated case is not a valid scenario: %v\n%s", seed, err, c.YAML())
		}
		total.Add(counts)
		if d != nil {
			small := oracle.Shrink(xdsPath(t), keeps, c)
			sd, _, _ := oracle.Check(xdsPath(t), keeps, small)
			out, _ := oracle.Print(small)
			t.Fatalf("seed %d: %v\nshrunk: %v\n%s", seed, d, sd, out)
		}
	}
	t.Logf("%d seeds, %d scenarios with requests, %d requests compared, 0 disagreements; answers: %v", n, compared, total.Requests, total.Answers)
	for _, k := range []string{"lane", "fallback", "lane-empty", "baseline", "invalid-lane", "canary", "no_instance", "lane_unavailable"} {
		if total.Answers[k] == 0 {
			t.Errorf("no answer of the model had reason or error %q: the cases miss a rule", k)
		}
	}
}

// expressible is c without its outcome reports (nil when nothing is left).
func expressible(c *oracle.Case) *oracle.Case {
	c.Steps = slices.DeleteFunc(c.Steps, func(st oracle.Step) bool { return st.Report != nil })
	if len(c.Steps) == 0 {
		return nil
	}
	return c
}

// xdsPath is the translation as a data path: each request is translated for
// its caller at its time and evaluated. The lane rides in x-lane, in the
// baggage member, or in both (x-lane decides) by turns.
func xdsPath(t testing.TB) oracle.Path {
	return func(s *scenario.Scenario) []oracle.Answer {
		out := make([]oracle.Answer, len(s.Steps))
		for i, st := range s.Steps {
			r := st.Request
			if r == nil {
				continue
			}
			res := xdsroute.Translate(xdsroute.Fleet{Policy: s.Policy, Instances: s.Instances, Now: scenario.Epoch.Add(st.At)},
				xdsroute.Caller{Zone: r.Zone, Host: r.Host})
			// Both variants answer; they must agree (the model then judges
			// the answer).
			var answers [2]oracle.Answer
			for v, res := range []*xdsroute.Resources{res, xdsroute.ForEnvoy(res, xdsroute.DefaultEgress)} {
				e, err := newEvaluator(res)
				if err != nil {
					t.Fatal(err)
				}
				a, err := e.eval(r.Service, laneHeaders(r.Lane, i), r.Key)
				if err != nil {
					t.Fatalf("%s, step %d, %s variant: %v", s.Name, i+1, e.variant, err)
				}
				answers[v] = a
			}
			if answers[0].String() != answers[1].String() {
				t.Fatalf("%s, step %d: the gRPC variant answered %s, the Envoy variant %s", s.Name, i+1, answers[0], answers[1])
			}
			out[i] = answers[0]
		}
		return out
	}
}

// laneHeaders carries the raw lane value v as the turn i says: in x-lane;
// as the lane member among others of baggage (for a value baggage can
// carry as it is); in both, with another lane in baggage, which x-lane
// overrides.
func laneHeaders(v string, turn int) headers {
	h := headers{}
	switch turn % 3 {
	case 0:
		if v != "" {
			h["x-lane"] = []string{v}
		}
	case 1:
		if v == "" {
			h["baggage"] = []string{"k1=v1"}
			break
		}
		if strings.Trim(v, " \t") == "" || strings.ContainsFunc(v, func(r rune) bool {
			return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("-_ \t", r))
		}) {
			h["x-lane"] = []string{v}
			break
		}
		h["baggage"] = []string{"k1=v1,lane=" + v + ";p=1", "lanes=other"}
	case 2:
		if v != "" {
			h["x-lane"] = []string{v}
			h["baggage"] = []string{"lane=bob"}
		}
	}
	return h
}

// TestExamples replays the scenarios of examples/scenarios (the conformance
// cases among them) through the translation, checking the expectations xDS
// can keep: expect, expect_lane, expect_error, and expect_share by weights.
// A scenario with outcome reports is outside what xDS expresses.
func TestExamples(t *testing.T) {
	examples, err := oracle.Examples("../../../examples/scenarios/*.yaml", 12)
	if err != nil {
		t.Fatal(err)
	}
	var replayed, skipped []string
	for _, s := range examples {
		f := s.File
		if slices.ContainsFunc(s.Steps, func(st scenario.Step) bool { return st.Report != nil }) {
			skipped = append(skipped, filepath.Base(f))
			continue
		}
		replayed = append(replayed, filepath.Base(f))
		for i, st := range s.Steps {
			r := st.Request
			res := xdsroute.Translate(xdsroute.Fleet{Policy: s.Policy, Instances: s.Instances, Now: scenario.Epoch.Add(st.At)},
				xdsroute.Caller{Zone: r.Zone, Host: r.Host})
			for _, res := range []*xdsroute.Resources{res, xdsroute.ForEnvoy(res, xdsroute.DefaultEgress)} {
				e, err := newEvaluator(res)
				if err != nil {
					t.Fatal(err)
				}
				where := fmt.Sprintf("%s:%d (%s)", filepath.Base(f), st.Line, e.variant)
				if sh := st.ExpectShare; sh != nil {
					rng := rand.New(rand.NewPCG(uint64(i), 2))
					served := 0
					for range sh.Samples {
						a, err := e.eval(r.Service, laneHeaders(r.Lane, 0), "k"+strconv.FormatUint(rng.Uint64(), 36))
						if err != nil {
							t.Fatalf("%s: %v", where, err)
						}
						if a.Error == "" && a.Lane == sh.Lane {
							served++
						}
					}
					if got := 100 * float64(served) / float64(sh.Samples); got < sh.Percent-sh.Tolerance || got > sh.Percent+sh.Tolerance {
						t.Errorf("%s: %.2f%% served in %q, want %g%% ± %g", where, got, sh.Lane, sh.Percent, sh.Tolerance)
					}
					continue
				}
				for turn := range 3 {
					a, err := e.eval(r.Service, laneHeaders(r.Lane, turn), r.Key)
					if err != nil {
						t.Fatalf("%s: %v", where, err)
					}
					if st.ExpectError != "" && a.Error != string(st.ExpectError) {
						t.Errorf("%s (turn %d): answered %s, want %s", where, turn, a, st.ExpectError)
					}
					if st.Expect != nil && !slices.Equal(a.Eligible, slices.Sorted(slices.Values(st.Expect))) {
						t.Errorf("%s (turn %d): answered %s, want %v", where, turn, a, st.Expect)
					}
					if st.ExpectLane != nil && (a.Error != "" || a.Lane != *st.ExpectLane) {
						t.Errorf("%s (turn %d): answered %s, want lane %q", where, turn, a, *st.ExpectLane)
					}
				}
			}
		}
	}
	t.Logf("replayed %d scenarios: %v; outside xDS (outcome reports): %v", len(replayed), replayed, skipped)
}
