package cli

import (
	"testing"

	"go.uber.org/goleak"
)

// lanes up and lanes dev start goroutines; the commands run in-process here leave none behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
