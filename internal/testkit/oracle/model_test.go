package oracle

import (
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/lanesdev/lanes/internal/lib/scenario"
)

// TestModelPassesExamples holds the model to the hand-written cases: every
// expectation of every scenario under examples/scenarios (the conformance
// cases among them) must be the model's answer too. The cases were written
// from the contract, case by case, apart from the model.
func TestModelPassesExamples(t *testing.T) {
	examples, err := Examples("../../../examples/scenarios/*.yaml", 12)
	if err != nil {
		t.Fatalf("%v (want at least the 12 conformance cases)", err)
	}
	for _, s := range examples {
		t.Run(filepath.Base(s.File), func(t *testing.T) {
			m := New(s.Policy, s.Instances, scenario.Epoch)
			for i, st := range s.Steps {
				m.At(scenario.Epoch.Add(st.At))
				if r := st.Report; r != nil {
					m.Report(r.Service, r.Instance, r.OK)
					continue
				}
				req := requestOf(st.Request)
				if sh := st.ExpectShare; sh != nil {
					rng := rand.New(rand.NewPCG(uint64(i), 1))
					served := 0
					for range sh.Samples {
						req.Key = "k" + strconv.FormatUint(rng.Uint64(), 36)
						if a := m.Resolve(req); a.Error == "" && a.Lane == sh.Lane {
							served++
						}
					}
					if got := 100 * float64(served) / float64(sh.Samples); got < sh.Percent-sh.Tolerance || got > sh.Percent+sh.Tolerance {
						t.Errorf("line %d: the model served %.2f%% in %q, want %g%% ± %g", st.Line, got, sh.Lane, sh.Percent, sh.Tolerance)
					}
					continue
				}
				a := m.Resolve(req)
				for range st.ExpectSticky - 1 {
					if b := m.Resolve(req); b.Lane != a.Lane || b.Error != a.Error {
						t.Errorf("line %d: the model answered %s, then %s, for one key", st.Line, a, b)
						break
					}
				}
				switch {
				case st.ExpectError != "":
					if a.Error != string(st.ExpectError) {
						t.Errorf("line %d: the model answered %s, want %s", st.Line, a, st.ExpectError)
					}
					continue
				case a.Error != "" && (st.Expect != nil || st.ExpectLane != nil || st.ExpectRequestLane != nil):
					t.Errorf("line %d: the model answered %s, want an answer", st.Line, a)
					continue
				}
				if st.Expect != nil && !slices.Equal(a.Eligible, slices.Sorted(slices.Values(st.Expect))) {
					t.Errorf("line %d: the model answered %s, want %v", st.Line, a, st.Expect)
				}
				if st.ExpectLane != nil && a.Lane != *st.ExpectLane {
					t.Errorf("line %d: the model answered %s, want lane %q", st.Line, a, *st.ExpectLane)
				}
				if st.ExpectRequestLane != nil && a.RequestLane != *st.ExpectRequestLane {
					t.Errorf("line %d: the model answered %s, want it to carry %q", st.Line, a, *st.ExpectRequestLane)
				}
			}
		})
	}
}

// TestGeneratedCasesParse: every generated case is a valid scenario, from
// fixed seeds and from arbitrary bytes.
func TestGeneratedCasesParse(t *testing.T) {
	for seed := range uint64(300) {
		c := Generate(Seeded(seed), "gen", 6)
		if _, err := scenario.Parse("gen.yaml", c.YAML()); err != nil {
			t.Fatalf("seed %d: %v\n%s", seed, err, c.YAML())
		}
	}
	for seed := range uint64(100) {
		rng := rand.New(rand.NewPCG(seed, 2))
		b := make([]byte, rng.IntN(300))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		c := Generate(Bytes(b), "gen", 6)
		if _, err := scenario.Parse("gen.yaml", c.YAML()); err != nil {
			t.Fatalf("bytes %x: %v\n%s", b, err, c.YAML())
		}
	}
}
