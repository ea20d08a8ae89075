package routing_test

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/lib/scenario"
	"github.com/lanesdev/lanes/internal/testkit/oracle"
	"github.com/lanesdev/lanes/routing"
)

// The routing engine against the reference model of the contract
// (internal/testkit/oracle): random fleets, policies and sequences of
// requests, reports and clock steps, replayed through the engine as `lanes
// simulate` replays a scenario, and through the model. Every snapshot the
// engine builds meanwhile is checked for its invariants (invariants_test.go).

var differentialScenarios = flag.Int("oracle.scenarios", 3000, "random scenarios TestDifferential runs")

func TestDifferential(t *testing.T) {
	n := *differentialScenarios
	if testing.Short() {
		n /= 10
	}
	start := time.Now()
	var total oracle.Counts
	for seed := range uint64(n) {
		// Sizes from small (easy to read when they fail) to larger.
		c := oracle.Generate(oracle.Seeded(seed), fmt.Sprintf("differential seed %d", seed), 2+int(seed%7))
		d, counts, err := oracle.Check(enginePicks, oracle.KeepsAll, c)
		if err != nil {
			t.Fatalf("seed %d: the generated case is not a valid scenario: %v\n%s", seed, err, c.YAML())
		}
		total.Add(counts)
		if d != nil {
			reportDisagreement(t, c, d)
			return
		}
	}
	t.Logf("%d scenarios, %d requests (with %d retries) and %d reports compared, 0 disagreements, in %s; answers: %v",
		n, total.Requests, total.Retries, total.Reports, time.Since(start).Round(time.Millisecond), total.Answers)
	// The generator reaches every rule: each reason and each error.
	for _, k := range []string{"lane", "fallback", "lane-empty", "baseline", "invalid-lane", "canary", "probe", "panic",
		"no_instance", "lane_unavailable", "retry failover", "retry no_instance", "retry lane_unavailable"} {
		if total.Answers[k] == 0 {
			t.Errorf("no answer of the model had reason or error %q: the generator misses a rule", k)
		}
	}
}

// FuzzDifferential drives the same generator from the fuzzer's bytes:
//
//	go test ./routing -run '^$' -fuzz FuzzDifferential
func FuzzDifferential(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("lanes routing contract"))
	f.Add([]byte{1, 0, 2, 3, 40, 5, 60, 7, 80, 9, 10, 11, 120, 13, 140, 15})
	f.Fuzz(func(t *testing.T, b []byte) {
		c := oracle.Generate(oracle.Bytes(b), "differential fuzz", 6)
		d, _, err := oracle.Check(enginePicks, oracle.KeepsAll, c)
		if err != nil {
			t.Fatalf("the generated case is not a valid scenario: %v\n%s", err, c.YAML())
		}
		if d != nil {
			reportDisagreement(t, c, d)
		}
	})
}

// enginePicks is the engine as `lanes simulate` drives it (Resolve), and
// after each request step, the path the transports take: Pick, with its
// fast path, its lane table and its locality caches, must choose from the
// eligible set that Resolve answered, with the same lanes and reason, or
// fail with the same error. (After a probe the instance is in flight, and
// the next request goes elsewhere: that step's picks are not compared.)
var enginePicks = oracle.EngineAnd(func(svc *routing.Service, req routing.Request, res scenario.StepResult) string {
	if res.Error != "" {
		_, err := svc.Pick(req)
		var re *routing.Error
		if !errors.As(err, &re) || string(re.Code) != res.Error {
			return fmt.Sprintf("Pick answered %v where Resolve failed with %s", err, res.Error)
		}
		return ""
	}
	if res.Reason == routing.ReasonProbe.String() {
		return ""
	}
	for range 2*len(res.Eligible) + 1 {
		r, err := svc.Pick(req)
		if err != nil {
			return fmt.Sprintf("Pick failed with %v", err)
		}
		if !slices.Contains(res.Eligible, r.Instance.ID) || r.Lane != res.ServingLane || r.RequestLane != res.RequestLane || r.Reason.String() != res.Reason {
			return fmt.Sprintf("Pick chose %s from lane %q, carrying %q (reason %s)", r.Instance.ID, r.Lane, r.RequestLane, r.Reason)
		}
	}
	return ""
})

// reportDisagreement shrinks the case and prints it in the scenario format,
// with the model's answers as its expectations.
func reportDisagreement(t *testing.T, c *oracle.Case, d *oracle.Disagreement) {
	t.Helper()
	small := oracle.Shrink(enginePicks, oracle.KeepsAll, c)
	small.Name = "the engine disagrees with the contract's model: " + c.Name
	sd, _, _ := oracle.Check(enginePicks, oracle.KeepsAll, small)
	out, err := oracle.Print(small)
	if err != nil {
		t.Fatalf("%v\n(printing the shrunk case failed: %v)", d, err)
	}
	t.Fatalf("%v\nshrunk from %d to %d steps: %v\nas a scenario, with the model's answers as expectations:\n%s",
		d, len(c.Steps), len(small.Steps), sd, out)
}
