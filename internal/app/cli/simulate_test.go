package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const (
	examples = "../../../examples/scenarios"
	bad      = "../../lib/scenario/testdata/bad"
)

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

func write(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const failingScenario = `name: expects the wrong things
instances:
  - {id: b1, service: orders, addr: 10.0.0.1:8080}
  - {id: a1, service: orders, addr: 10.0.9.1:8080, lane: alice}
steps:
  - request: {lane: alice}
    expect: [a1]
  - request: {lane: alice}
    expect: [b1]
  - report: {instance: a1, ok: false}
  - request: {}
    expect_error: no_instance
`

func TestSimulateExamplesPass(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(examples, "*.yaml"))
	if len(files) < 10 {
		t.Fatalf("%d example files", len(files))
	}
	code, out, errOut := run(t, append([]string{"simulate"}, files...)...)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s", code, errOut, out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != len(files) {
		t.Fatalf("%d summary lines for %d files:\n%s", len(lines), len(files), out)
	}
	re := regexp.MustCompile(`^ok   (\S+)  (.+)  \((\d+) steps?\)$`)
	for i, l := range lines {
		m := re.FindStringSubmatch(l)
		if m == nil || m[1] != files[i] {
			t.Errorf("summary line %q for %s", l, files[i])
		}
	}
	if lines[0] != "ok   ../../../examples/scenarios/01-isolation.yaml  baseline and lane requests stay apart  (4 steps)" {
		t.Errorf("first line %q", lines[0])
	}
}

// A directory stands for its scenario files, in name order.
func TestSimulateDirectory(t *testing.T) {
	code, out, _ := run(t, "simulate", examples)
	files, _ := filepath.Glob(filepath.Join(examples, "*.yaml"))
	if code != 0 || strings.Count(out, "\nok   ")+1 != len(files) {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	// A pattern the shell left alone is expanded.
	code, out, _ = run(t, "simulate", filepath.Join(examples, "0*.yaml"))
	if code != 0 || strings.Count(out, "ok   ") != 9 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	code, _, errOut := run(t, "simulate", t.TempDir())
	if code != 2 || !strings.Contains(errOut, "no scenario files") {
		t.Errorf("empty directory: exit %d, stderr %q", code, errOut)
	}
}

func TestSimulateFailures(t *testing.T) {
	dir := t.TempDir()
	f := write(t, dir, "wrong.yaml", failingScenario)
	ok := filepath.Join(examples, "01-isolation.yaml")
	code, out, errOut := run(t, "simulate", f, ok)
	if code != 1 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	want := "FAIL " + f + "  expects the wrong things  (4 steps, 2 failed)\n" +
		"  " + f + ":8: step 2: expected eligible [b1], engine answered [a1] from lane alice (reason lane)\n" +
		"  " + f + ":11: step 4: expected error no_instance, engine answered [b1] from the baseline (reason baseline)\n" +
		"ok   " + ok + "  baseline and lane requests stay apart  (4 steps)\n"
	if out != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", out, want)
	}
}

func TestSimulateMalformed(t *testing.T) {
	dir := t.TempDir()
	wrong := write(t, dir, "wrong.yaml", failingScenario)
	ok := filepath.Join(examples, "02-baseline-empty.yaml")
	args := []string{"simulate", filepath.Join(bad, "unknown-field.yaml"), wrong, filepath.Join(dir, "missing.yaml"), ok, filepath.Join(bad, "bad-policy.yaml")}
	code, out, errOut := run(t, args...)
	if code != 2 {
		t.Fatalf("exit %d", code)
	}
	// The other files still run: one failed, one passed.
	if !strings.Contains(out, "FAIL "+wrong) || !strings.Contains(out, "ok   "+ok) {
		t.Errorf("stdout:\n%s", out)
	}
	wantErr := bad + "/unknown-field.yaml:8: field steps[1].expect_lanes: unknown field; known fields here: at, request, report, expect, expect_lane, expect_request_lane, expect_error, expect_share, expect_sticky\n" +
		filepath.Join(dir, "missing.yaml") + ": cannot read: no such file or directory\n" +
		bad + "/bad-policy.yaml:4: field policy.lanes.alice.fallback: fallback cycle alice -> bob -> alice\n"
	if errOut != wantErr {
		t.Errorf("stderr:\n%s\nwant:\n%s", errOut, wantErr)
	}
	// Every malformed sample exits 2 and names file, line and field.
	files, _ := filepath.Glob(filepath.Join(bad, "*.yaml"))
	re := regexp.MustCompile(`^\S+\.yaml:\d+: (field \S+: )?\S`)
	for _, f := range files {
		code, out, errOut := run(t, "simulate", f)
		if code != 2 || out != "" || !re.MatchString(errOut) || !strings.HasPrefix(errOut, f+":") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", f, code, out, errOut)
		}
	}
}

type jsonStep struct {
	File     string   `json:"file"`
	Step     int      `json:"step"`
	Lane     *string  `json:"lane"`
	Eligible []string `json:"eligible"`
	Error    *string  `json:"error"`
	Reason   *string  `json:"reason"`
	OK       *bool    `json:"ok"`
	Message  string   `json:"message"`
	Raw      string   `json:"-"`
}

func parseJSONLines(t *testing.T, out string) []jsonStep {
	t.Helper()
	var steps []jsonStep
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var s jsonStep
		if err := json.Unmarshal([]byte(l), &s); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if s.Lane == nil || s.Error == nil || s.Reason == nil || s.OK == nil || !strings.Contains(l, `"eligible":[`) {
			t.Errorf("line lacks a field: %s", l)
		}
		s.Raw = l
		steps = append(steps, s)
	}
	return steps
}

func TestSimulateJSON(t *testing.T) {
	code, out, errOut := run(t, "simulate", "--json", filepath.Join(examples, "01-isolation.yaml"), filepath.Join(examples, "09-outlier.yaml"))
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	steps := parseJSONLines(t, out)
	if len(steps) != 4+9 {
		t.Fatalf("%d JSON lines:\n%s", len(steps), out)
	}
	first := `{"file":"../../../examples/scenarios/01-isolation.yaml","step":1,"lane":"","eligible":["b1","b2"],"error":"","reason":"baseline","ok":true}`
	if steps[0].Raw != first {
		t.Errorf("first line\n%s\nwant\n%s", steps[0].Raw, first)
	}
	if s := steps[1]; *s.Lane != "alice" || strings.Join(s.Eligible, ",") != "a1" || *s.Reason != "lane" {
		t.Errorf("step 2: %s", s.Raw)
	}
	if s := steps[4+1]; s.Step != 2 || len(s.Eligible) != 0 || !*s.OK { // a report step
		t.Errorf("report step: %s", s.Raw)
	}
	if s := steps[4+5]; strings.Join(s.Eligible, ",") != "b1" || *s.Reason != "probe" {
		t.Errorf("probe step: %s", s.Raw)
	}

	dir := t.TempDir()
	wrong := write(t, dir, "wrong.yaml", failingScenario)
	code, out, _ = run(t, "simulate", "--json", wrong, filepath.Join(examples, "02-baseline-empty.yaml"))
	if code != 1 {
		t.Fatalf("exit %d", code)
	}
	steps = parseJSONLines(t, out)
	if len(steps) != 4+3 {
		t.Fatalf("%d JSON lines", len(steps))
	}
	if s := steps[1]; *s.OK || s.Message == "" || s.File != wrong || s.Step != 2 {
		t.Errorf("failed step: %s", s.Raw)
	}
	if s := steps[4]; *s.Error != "no_instance" || len(s.Eligible) != 0 || !*s.OK || s.Eligible == nil {
		t.Errorf("error step: %s", s.Raw)
	}
	if s := steps[5]; *s.Lane != "alice" || *s.OK != true {
		t.Errorf("step: %s", s.Raw)
	}

	// Malformed files go to stderr; stdout keeps only JSON.
	code, out, errOut = run(t, "simulate", "--json", filepath.Join(bad, "bad-duration.yaml"), filepath.Join(examples, "02-baseline-empty.yaml"))
	if code != 2 || !strings.Contains(errOut, "bad-duration.yaml:5: field steps[0].at") || len(parseJSONLines(t, out)) != 3 {
		t.Errorf("exit %d, stderr %q, stdout:\n%s", code, errOut, out)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"simulate"},
		{"simulate", "--nope", "x.yaml"},
		{"nope"},
	} {
		code, out, errOut := run(t, args...)
		if code != 2 || !strings.Contains(errOut, "--help' for usage") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	code, out, _ := run(t, "simulate", "--help")
	if code != 0 || !strings.Contains(out, "Exit status: 0 when every expectation") {
		t.Errorf("help: exit %d:\n%s", code, out)
	}
	code, out, _ = run(t)
	if code != 0 || !strings.Contains(out, "simulate") {
		t.Errorf("no arguments: exit %d:\n%s", code, out)
	}
}
