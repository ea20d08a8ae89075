package oracle

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/lanesdev/lanes/internal/lib/scenario"
)

// Examples parses the scenario files that match glob, in name order: the
// hand-written cases of examples/scenarios, the conformance cases among
// them, that every data path is held to. It fails when fewer than min
// match, or one does not parse.
func Examples(glob string, min int) ([]*scenario.Scenario, error) {
	files, err := filepath.Glob(glob)
	if err != nil {
		return nil, err
	}
	if len(files) < min {
		return nil, fmt.Errorf("%s: %d scenarios, want at least %d", glob, len(files), min)
	}
	out := make([]*scenario.Scenario, 0, len(files))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		s, err := scenario.Parse(f, data)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}
