package cli

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

func runVet(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("lanes vet loads packages with the go command, which is not on PATH")
	}
	t.Chdir("testdata/vetmod")
	var out, errOut bytes.Buffer
	code = Main(append([]string{"vet"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestVetFindings(t *testing.T) {
	code, out, errOut := runVet(t, "./dirty")
	if code != ExitFail {
		t.Fatalf("exit %d, want %d; stderr: %s", code, ExitFail, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d findings, want 2:\n%s", len(lines), out)
	}
	for i, want := range []string{
		"dirty/dirty.go:12:11: context.Background() drops the lane of the request's context r.Context(); use r.Context() (or lane.Detach(r.Context()) for work that outlives the request) (lanectx)",
		"dirty/dirty.go:13:12: http.NewRequest builds a request without the context r.Context(), so it carries no lane; use http.NewRequestWithContext(r.Context(), ...) (lanehttp)",
	} {
		if !strings.HasSuffix(lines[i], want) {
			t.Errorf("line %d:\n got %s\nwant …%s", i+1, lines[i], want)
		}
	}
}

func TestVetClean(t *testing.T) {
	code, out, errOut := runVet(t, "./clean")
	if code != ExitOK || out != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 0 and nothing", code, out, errOut)
	}
}

func TestVetJSON(t *testing.T) {
	code, out, errOut := runVet(t, "-o", "json", "./dirty")
	if code != ExitFail {
		t.Fatalf("exit %d, want %d; stderr: %s", code, ExitFail, errOut)
	}
	// go vet -json: {package: {analyzer: [{posn, message, ...}]}}
	var tree map[string]map[string][]struct {
		Posn    string `json:"posn"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal([]byte(out), &tree); err != nil {
		t.Fatalf("not go vet's -json form: %v\n%s", err, out)
	}
	diags := tree["example.com/vetmod/dirty"]
	if len(diags["lanectx"]) != 1 || len(diags["lanehttp"]) != 1 {
		t.Fatalf("want one lanectx and one lanehttp diagnostic, got %s", out)
	}
	if !strings.HasSuffix(diags["lanectx"][0].Posn, "dirty/dirty.go:12:11") {
		t.Errorf("posn %q", diags["lanectx"][0].Posn)
	}
}

func TestVetLoadError(t *testing.T) {
	code, _, errOut := runVet(t, "./broken")
	if code != ExitUsage || !strings.Contains(errOut, "cannot load the packages") || !strings.Contains(errOut, "broken.go:4") {
		t.Fatalf("exit %d, stderr %q; want 2 naming broken.go:4", code, errOut)
	}
}

func TestVetBadOutput(t *testing.T) {
	code, _, errOut := runVet(t, "-o", "xml", "./clean")
	if code != ExitUsage || !strings.Contains(errOut, `-o "xml": want text, json or yaml`) {
		t.Fatalf("exit %d, stderr %q; want 2 naming -o and the value", code, errOut)
	}
}
