package vet_test

import (
	"testing"

	"golang.org/x/tools/go/analysis/analysistest"

	"github.com/lanesdev/lanes/internal/lib/vet"
)

// skipRace skips an analyzer's test under the race detector. Each test
// loads one package, whose analyzers the checker runs one after another, so
// the race detector has nothing to watch; type-checking net/http and what it
// imports from source, which analysistest does for each test, takes 6 times
// as long under it (61 s for the package). The analyzers run concurrently,
// on every package of the module, in internal/e2e/layout's TestVetClean,
// under -race too.
func skipRace(t *testing.T) {
	if raceEnabled {
		t.Skip("one package's analysis is sequential: nothing for the race detector; internal/e2e/layout runs the analyzers concurrently")
	}
}

func TestContextDropped(t *testing.T) {
	skipRace(t)
	analysistest.RunWithSuggestedFixes(t, analysistest.TestData(), vet.ContextDropped, "ctxcase")
}

func TestGoroutineOutlives(t *testing.T) {
	skipRace(t)
	analysistest.RunWithSuggestedFixes(t, analysistest.TestData(), vet.GoroutineOutlives, "gocase")
}

func TestHTTPWithoutContext(t *testing.T) {
	skipRace(t)
	analysistest.RunWithSuggestedFixes(t, analysistest.TestData(), vet.HTTPWithoutContext, "httpcase")
}

func TestBypass(t *testing.T) {
	skipRace(t)
	if err := vet.Bypass.Flags.Set("allow", "bypasscase.registry,unix:"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vet.Bypass.Flags.Set("allow", "") })
	analysistest.Run(t, analysistest.TestData(), vet.Bypass, "bypasscase")
}

func TestIgnore(t *testing.T) {
	skipRace(t)
	analysistest.Run(t, analysistest.TestData(), vet.ContextDropped, "ignorecase")
}
