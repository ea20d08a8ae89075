package scenario

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func mustParse(t *testing.T, doc string) *Scenario {
	t.Helper()
	s, err := Parse("t.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const failing = `name: wrong on purpose
policy:
  lanes:
    carol: {strict: true}
  canary:
    - {service: orders, lane: canary, percent: 50}
instances:
  - {id: b1, service: orders, addr: 10.0.0.1:8080}
  - {id: a1, service: orders, addr: 10.0.9.1:8080, lane: alice}
  - {id: k1, service: orders, addr: 10.0.7.1:8080, lane: canary}
steps:
  - request: {lane: alice}
    expect: [b1]
  - request: {lane: alice}
    expect_lane: ""
  - request: {lane: bob}
    expect_error: no_instance
  - request: {lane: carol}
    expect: [b1]
  - report: {instance: b1, ok: true}
  - request: {lane: "Al_ice", key: user-1}
    expect: [a1]
    expect_request_lane: alice
  - request: {}
    expect_share: {lane: canary, percent: 10, tolerance: 1, samples: 400}
  - request: {}
    expect_sticky: 400
  - request: {lane: carol}
    expect_sticky: 2
  - request: {lane: alice}
    expect: [a1]
    expect_lane: alice
`

func TestRunReportsFailures(t *testing.T) {
	res := Run(mustParse(t, failing), Options{})
	if res.OK() || res.Name != "wrong on purpose" || res.File != "t.yaml" {
		t.Fatalf("result %+v", res)
	}
	want := []struct {
		ok                        bool
		lane                      string
		eligible, errCode, reason string
		msg                       string
	}{
		{false, "alice", "a1", "", "lane", "expected eligible [b1], engine answered [a1] from lane alice (reason lane)"},
		{false, "alice", "a1", "", "lane", "expected the baseline to serve, engine answered [a1] from lane alice (reason lane)"},
		{false, "bob", "b1", "", "lane-empty", "expected error no_instance, engine answered [b1] from the baseline (reason lane-empty)"},
		{false, "carol", "", "lane_unavailable", "", `expected eligible [b1], engine answered lane_unavailable (service "orders" has no instance in the strict chain of lane "carol")`},
		{true, "", "", "", "", ""},
		{false, "Al_ice", "b1", "", "invalid-lane", "expected eligible [a1], engine answered [b1] from the baseline (reason invalid-lane); expected the request to carry lane alice downstream, engine answered [b1], carrying no lane (reason invalid-lane)"},
		{false, "", "", "", "", "expected lane canary to serve 10% ± 1 of 400 requests with random keys, engine answered "},
		{false, "", "", "", "", "expected 400 requests with no key to be served by one lane, engine answered "},
		{false, "carol", "", "lane_unavailable", "", "expected 2 requests with no key to be served by one lane, engine answered lane_unavailable 2 times"},
		{true, "alice", "a1", "", "lane", ""},
	}
	if len(res.Steps) != len(want) {
		t.Fatalf("%d results", len(res.Steps))
	}
	for i, w := range want {
		r := res.Steps[i]
		if r.Step != i+1 || r.File != "t.yaml" {
			t.Errorf("step %d: numbered %d in %q", i+1, r.Step, r.File)
		}
		if r.OK != w.ok || r.Lane != w.lane || r.Error != w.errCode || !strings.HasPrefix(r.Message, w.msg) || w.msg == "" && r.Message != "" {
			t.Errorf("step %d: got ok=%v lane=%q error=%q message %q", i+1, r.OK, r.Lane, r.Error, r.Message)
		}
		if w.eligible != "" && strings.Join(r.Eligible, ",") != w.eligible || w.reason != "" && r.Reason != w.reason {
			t.Errorf("step %d: got eligible %v reason %q", i+1, r.Eligible, r.Reason)
		}
		if r.Eligible == nil {
			t.Errorf("step %d: nil eligible", i+1)
		}
	}
	if got := len(res.Failures()); got != 8 {
		t.Errorf("%d failures, want 8", got)
	}
	if res.Steps[0].Line != 12 || res.Steps[4].Line != 20 {
		t.Errorf("lines %d %d", res.Steps[0].Line, res.Steps[4].Line)
	}
}

func TestStepResultJSON(t *testing.T) {
	res := Run(mustParse(t, failing), Options{})
	for _, r := range res.Steps {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"file", "step", "lane", "eligible", "error", "reason", "ok"} {
			if _, ok := m[k]; !ok {
				t.Errorf("%s lacks %q", b, k)
			}
		}
		if _, ok := m["eligible"].([]any); !ok {
			t.Errorf("eligible is not an array in %s", b)
		}
		if _, has := m["message"]; has == r.OK {
			t.Errorf("message present=%v on ok=%v: %s", has, r.OK, b)
		}
	}
}

// Runs are reproducible: the random keys of expect_share are seeded by the
// scenario and the step.
func TestRunIsReproducible(t *testing.T) {
	doc := `name: share
policy:
  canary: [{service: orders, lane: canary, percent: 37}]
instances:
  - {id: b1, service: orders, addr: 10.0.0.1:8080}
  - {id: k1, service: orders, addr: 10.0.7.1:8080, lane: canary}
steps:
  - request: {}
    expect_share: {lane: canary, percent: 0, tolerance: 0, samples: 999}
`
	s := mustParse(t, doc)
	first := Run(s, Options{}).Steps[0].Message
	for range 3 {
		if got := Run(s, Options{}).Steps[0].Message; got != first {
			t.Fatalf("runs differ:\n%s\n%s", first, got)
		}
	}
	if other := Run(s, Options{Seed: 99}).Steps[0].Message; other == first {
		t.Errorf("the seed changes nothing: %s", other)
	}
}

// Every malformed file of testdata/bad is refused with its file, line and
// field.
func TestBadFiles(t *testing.T) {
	want := map[string]string{
		"bad-duration.yaml":            "bad-duration.yaml:5: field steps[0].at: bad duration",
		"bad-instance.yaml":            "bad-instance.yaml:6: field instances[1].addr: invalid addr",
		"bad-policy.yaml":              "bad-policy.yaml:4: field policy.lanes.alice.fallback: fallback cycle",
		"both-request-and-report.yaml": "both-request-and-report.yaml:5: field steps[0]: a step has exactly one of request and report; this one has both",
		"not-yaml.yaml":                "not-yaml.yaml:2: malformed YAML",
		"time-goes-back.yaml":          "time-goes-back.yaml:7: field steps[1].at: time goes back",
		"unknown-field.yaml":           "unknown-field.yaml:8: field steps[1].expect_lanes: unknown field",
	}
	files, _ := filepath.Glob("testdata/bad/*.yaml")
	if len(files) != len(want) {
		t.Errorf("%d bad files, %d expected errors", len(files), len(want))
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Parse(filepath.Base(f), data)
		if err == nil || !strings.HasPrefix(err.Error(), want[filepath.Base(f)]) {
			t.Errorf("%s: got %v, want %s...", f, err, want[filepath.Base(f)])
		}
	}
}

// The scenarios of testdata/known-bugs describe engine bugs: they fail
// until the engine is fixed. They are run so that a fix shows up here.

// TestRawLaneWhitespace: only spaces and tabs are trimmed from a step's raw
// lane, as from a header: a value of them alone is no lane, and a line feed
// makes the value an invalid lane.
func TestRawLaneWhitespace(t *testing.T) {
	s := mustParse(t, `name: whitespace in raw lanes
instances:
  - {id: b1, service: orders, addr: 10.0.0.1:8080}
steps:
  - request: {lane: " \t "}
  - request: {lane: "\n"}
  - request: {lane: " Alice\t"}
`)
	res := Run(s, Options{})
	for i, want := range []string{"baseline", "invalid-lane", "lane-empty"} {
		if got := res.Steps[i].Reason; got != want {
			t.Errorf("step %d (lane %q): reason %s, want %s", i+1, res.Steps[i].Lane, got, want)
		}
	}
}
