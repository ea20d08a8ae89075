package vet_test

import (
	"testing"

	"golang.org/x/tools/go/analysis/analysistest"

	"github.com/lanesdev/lanes/internal/lib/vet"
)

func TestContextDropped(t *testing.T) {
	analysistest.RunWithSuggestedFixes(t, analysistest.TestData(), vet.ContextDropped, "ctxcase")
}

func TestGoroutineOutlives(t *testing.T) {
	analysistest.RunWithSuggestedFixes(t, analysistest.TestData(), vet.GoroutineOutlives, "gocase")
}

func TestHTTPWithoutContext(t *testing.T) {
	analysistest.RunWithSuggestedFixes(t, analysistest.TestData(), vet.HTTPWithoutContext, "httpcase")
}

func TestBypass(t *testing.T) {
	if err := vet.Bypass.Flags.Set("allow", "bypasscase.registry,unix:"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vet.Bypass.Flags.Set("allow", "") })
	analysistest.Run(t, analysistest.TestData(), vet.Bypass, "bypasscase")
}

func TestIgnore(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), vet.ContextDropped, "ignorecase")
}
