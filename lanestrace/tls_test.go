package lanestrace_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanesdev/lanes/lanestrace"
)

// An https:// LANES_TRACES is verified with LANES_CA_FILE; a CA file that
// cannot be read is an error naming the variable and the file (the export
// over TLS itself is tested with lanes up's collector, in
// internal/app/controlplane).
func TestFromEnvCAFile(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "ca.pem")
	vars := map[string]string{lanestrace.EnvTraces: "https://127.0.0.1:4317", lanestrace.EnvCAFile: missing}
	_, err := lanestrace.FromEnv(context.Background(), "orders", func(k string) string { return vars[k] })
	if err == nil || !strings.Contains(err.Error(), lanestrace.EnvCAFile) || !strings.Contains(err.Error(), missing) {
		t.Errorf("got %v, want an error naming %s and %s", err, lanestrace.EnvCAFile, missing)
	}
}
