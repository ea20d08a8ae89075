package layout

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/lib/vet"
)

// TestVetClean runs lanes vet on lanes' own code, tests included: every finding is fixed, or
// silenced with //lanes:ignore and its reason.
func TestVetClean(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("lanes vet loads packages with the go command, which is not on PATH")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := vet.Run(ctx, []string{module + "/..."}, vet.Options{Tests: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range res.Findings {
		t.Errorf("%s", f)
	}
}
