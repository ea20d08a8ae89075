package docs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanesdev/lanes/internal/testkit/childproc"
)

// TestVetAsModuleTool runs `lanes vet` as docs/vet.md says to inside an application's module:
// `go get -tool`, then `go tool lanes vet ./...`. The module starts without lanes in its go.mod
// (lanes is replaced by this checkout); the finding is a request sent through http.DefaultClient.
func TestVetAsModuleTool(t *testing.T) {
	if testing.Short() {
		t.Skip("builds lanes in a module of its own")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs/vet.md"))
	if err != nil {
		t.Fatal(err)
	}
	const getTool, goTool = "go get -tool github.com/lanesdev/lanes/cmd/lanes@latest", "go tool lanes vet ./..."
	for _, line := range []string{getTool, goTool} {
		if !strings.Contains(string(doc), line) {
			t.Fatalf("docs/vet.md no longer says %q", line)
		}
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/shop\n\ngo 1.26\n\nreplace github.com/lanesdev/lanes => " + abs + "\n",
		"main.go": `package main

import "net/http"

func main() {
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), "GET", "http://payments/charge", nil)
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
		}
	})
	http.ListenAndServe(":0", nil)
}
`,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gocmd := func(env []string, args ...string) (string, error) {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// The module cache first, as a proxy, so that the test runs offline once the modules were
	// fetched; then the proxy. (This checkout stands for @latest: the replace directive.)
	get := []string{"get", "-tool", "github.com/lanesdev/lanes/cmd/lanes"}
	if out, err := gocmd([]string{"GOPROXY=file://" + modCache(), "GOSUMDB=off", "GOFLAGS=-mod=mod"}, get...); err != nil {
		out2, err := gocmd(nil, get...)
		if err != nil {
			if strings.Contains(out2, "dial tcp") || strings.Contains(out2, "lookup ") {
				t.Skipf("the Go module proxy cannot be reached: %s", out2)
			}
			t.Fatalf("go get -tool: %v\n%s\n%s", err, out, out2)
		}
	}
	out, err := gocmd(nil, "tool", "lanes", "vet", "./...")
	if code := childproc.ExitCode(err); code != 1 || !strings.Contains(out, "main.go:8:") || !strings.Contains(out, "http.DefaultClient.Do sends with http.DefaultTransport") {
		t.Fatalf("go tool lanes vet: exit %d, want 1 and the http.DefaultClient.Do finding:\n%s", code, out)
	}
}
