package docs

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// errOffline says that the Go module proxy could not be reached.
var errOffline = errors.New("the Go module proxy cannot be reached")

// buildOwnModule builds the program in dir (main.go) as a user does in an
// empty folder (go mod init, go mod tidy, go build), with the lanes module
// replaced by this checkout. Modules come from the module cache when they
// are there, else from the proxy. The binary is dir/bin.
func buildOwnModule(t *testing.T, dir, code string) (string, error) {
	t.Helper()
	abs, err := filepath.Abs(root)
	if err != nil {
		return "", err
	}
	gomod := "module example.com/hello\n\ngo 1.26\n\nrequire github.com/lanesdev/lanes v0.0.0\n\nreplace github.com/lanesdev/lanes => " + abs + "\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		return "", err
	}
	if sum, err := os.ReadFile(filepath.Join(root, "go.sum")); err == nil {
		os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644)
	}
	run := func(env []string, args ...string) (string, error) {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), append([]string{"GOFLAGS=-mod=mod"}, env...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// The module cache first, so that the test runs offline once the
	// modules were fetched; then the proxy.
	if _, err := run([]string{"GOPROXY=file://" + modCache(), "GOSUMDB=off"}, "mod", "tidy"); err != nil {
		out, err := run(nil, "mod", "tidy")
		if err != nil {
			if strings.Contains(out, "dial tcp") || strings.Contains(out, "lookup ") || strings.Contains(out, "no such host") || strings.Contains(out, "connection refused") {
				return out, errOffline
			}
			return out, err
		}
	}
	return run(nil, "build", "-o", "bin", ".")
}

// modCache is the download directory of the module cache, which the go
// command reads as a proxy (file://...).
func modCache() string {
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		return ""
	}
	return filepath.Join(strings.TrimSpace(string(out)), "cache", "download")
}
