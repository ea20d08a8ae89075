package routing_test

import (
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/oracle"
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
		d, counts, err := oracle.Check(oracle.Engine, oracle.KeepsAll, c)
		if err != nil {
			t.Fatalf("seed %d: the generated case is not a valid scenario: %v\n%s", seed, err, c.YAML())
		}
		total.Add(counts)
		if d != nil {
			reportDisagreement(t, c, d)
			return
		}
	}
	t.Logf("%d scenarios, %d requests and %d reports compared, 0 disagreements, in %s; answers: %v",
		n, total.Requests, total.Reports, time.Since(start).Round(time.Millisecond), total.Answers)
	// The generator reaches every rule: each reason and each error.
	for _, k := range []string{"lane", "fallback", "lane-empty", "baseline", "invalid-lane", "canary", "probe", "panic",
		"no_instance", "lane_unavailable"} {
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
		d, _, err := oracle.Check(oracle.Engine, oracle.KeepsAll, c)
		if err != nil {
			t.Fatalf("the generated case is not a valid scenario: %v\n%s", err, c.YAML())
		}
		if d != nil {
			reportDisagreement(t, c, d)
		}
	})
}

// reportDisagreement shrinks the case and prints it in the scenario format,
// with the model's answers as its expectations.
func reportDisagreement(t *testing.T, c *oracle.Case, d *oracle.Disagreement) {
	t.Helper()
	small := oracle.Shrink(oracle.Engine, oracle.KeepsAll, c)
	small.Name = "the engine disagrees with the contract's model: " + c.Name
	sd, _, _ := oracle.Check(oracle.Engine, oracle.KeepsAll, small)
	out, err := oracle.Print(small)
	if err != nil {
		t.Fatalf("%v\n(printing the shrunk case failed: %v)", d, err)
	}
	t.Fatalf("%v\nshrunk from %d to %d steps: %v\nas a scenario, with the model's answers as expectations:\n%s",
		d, len(c.Steps), len(small.Steps), sd, out)
}
