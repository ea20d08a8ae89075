package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/testkit/leaktest"
)

// TestBinary builds the real lanes binary and runs `lanes simulate` on the
// example scenarios (exit 0) and on a malformed file (exit 2).
func TestBinary(t *testing.T) {
	bin, _ := binary(t)
	files, _ := filepath.Glob("../../examples/scenarios/*.yaml")
	if len(files) < 10 {
		t.Fatalf("%d example files", len(files))
	}

	code, out, errOut := runBin(t, bin, append([]string{"simulate"}, files...)...)
	if code != 0 || errOut != "" || strings.Count(out, "\n") != len(files) || strings.Count(out, "ok   ") != len(files) {
		t.Errorf("examples: exit %d, stderr %q, stdout:\n%s", code, errOut, out)
	}

	code, out, errOut = runBin(t, bin, "simulate", "../../internal/lib/scenario/testdata/bad/time-goes-back.yaml")
	want := "../../internal/lib/scenario/testdata/bad/time-goes-back.yaml:7: field steps[1].at: time goes back"
	if code != 2 || out != "" || !strings.HasPrefix(errOut, want) {
		t.Errorf("malformed: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// The lanes binary, built once for the package's tests (a link of the
// whole binary is most of their time): with VCS information, which a build
// in a git checkout stamps anyway.
var (
	buildOnce sync.Once
	built     string
	buildErr  error
)

// binary returns the built lanes binary and the go command that built it;
// it skips the test where there is no go command.
func binary(t *testing.T) (bin, gobin string) {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build the binary with")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "lanes-cmd-test-")
		if err != nil {
			buildErr = err
			return
		}
		built = filepath.Join(dir, "lanes")
		build := exec.Command(gobin, "build", "-buildvcs=true", "-o", built, ".")
		build.Env = append(os.Environ(), "GOFLAGS=") // a -buildvcs=false there wins over the flag
		if out, err := build.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built, gobin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built != "" {
		os.RemoveAll(filepath.Dir(built))
	}
	if code == 0 {
		if err := goleak.Find(leaktest.Options()...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func runBin(t *testing.T, bin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errb.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errb.String()
	}
	t.Fatal(err)
	return 0, "", ""
}

// TestVersionRevision: a binary built with VCS information says its
// module version and revision in `lanes version` and `lanes --version`.
func TestVersionRevision(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git: the build cannot stamp a revision")
	}
	rev, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	bin, gobin := binary(t)
	if out, _ := exec.Command(gobin, "version", "-m", bin).Output(); !strings.Contains(string(out), "vcs.revision") {
		t.Skip("the go command stamped no VCS information here (a git worktree, whose .git is a file); versionOf's test covers the format")
	}
	want := "revision " + strings.TrimSpace(string(rev))
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errOut := runBin(t, bin, args...)
		if code != 0 || !strings.HasPrefix(out, "lanes ") || !strings.Contains(out, want) {
			t.Errorf("lanes %s: exit %d, stdout %q, stderr %q; want %q", args[0], code, out, errOut, want)
		}
	}
}
