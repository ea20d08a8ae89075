package scenario

import (
	"os"
	"path/filepath"
	"testing"
)

const examples = "../../../examples/scenarios"

func exampleFiles(t testing.TB) []string {
	files, err := filepath.Glob(filepath.Join(examples, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("found %d example scenarios in %s, want at least the 10 conformance cases", len(files), examples)
	}
	return files
}

// TestExamples parses and runs every example scenario: each must pass.
func TestExamples(t *testing.T) {
	for _, f := range exampleFiles(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			s, err := Parse(f, data)
			if err != nil {
				t.Fatal(err)
			}
			res := Run(s, Options{})
			if len(res.Steps) != len(s.Steps) {
				t.Fatalf("%d step results for %d steps", len(res.Steps), len(s.Steps))
			}
			for _, r := range res.Failures() {
				t.Errorf("%s:%d: step %d: %s", f, r.Line, r.Step, r.Message)
			}
		})
	}
}
