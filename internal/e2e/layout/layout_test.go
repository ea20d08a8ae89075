// Package layout checks that imports flow one way between the kinds of folders that
// docs/architecture.md describes: public packages, internal/lib, internal/app, internal/testkit,
// internal/e2e, cmd and bench.
package layout

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/lanesdev/lanes"

// kind names the folder kind of a package path relative to the module root.
func kind(rel string) string {
	switch {
	case strings.HasPrefix(rel, "internal/lib/"):
		return "lib"
	case strings.HasPrefix(rel, "internal/app/"):
		return "app"
	case strings.HasPrefix(rel, "internal/testkit/"):
		return "testkit"
	case strings.HasPrefix(rel, "internal/e2e/"):
		return "e2e"
	case strings.HasPrefix(rel, "internal/"):
		return "internal-other"
	case rel == "cmd" || strings.HasPrefix(rel, "cmd/"):
		return "cmd"
	case strings.HasPrefix(rel, "bench/"), strings.HasPrefix(rel, "examples/"):
		return "tool"
	default:
		return "public"
	}
}

// allowed lists, for each kind, the kinds its non-test files may import.
var allowed = map[string][]string{
	"public":  {"public", "lib"},
	"lib":     {"public", "lib"},
	"app":     {"public", "lib", "app"},
	"testkit": {"public", "lib", "testkit"},
	"e2e":     {"public", "lib", "app", "testkit", "e2e"},
	"cmd":     {"public", "lib", "app"},
	"tool":    {"public", "lib", "app", "testkit", "tool"},
}

// testExtra lists the kinds that a kind's test files may import beyond allowed.
var testExtra = map[string][]string{
	"public":  {"testkit"},
	"lib":     {"testkit"},
	"app":     {"testkit"},
	"testkit": {},
	"e2e":     {},
	"cmd":     {"testkit"},
	"tool":    {},
}

func TestImportsFlowOneWay(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is not on PATH")
	}
	cmd := exec.Command("go", "list", "-f",
		"{{.ImportPath}}|{{join .Imports \" \"}}|{{join .TestImports \" \"}} {{join .XTestImports \" \"}}",
		module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	checked := 0
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), "|", 3)
		if len(parts) != 3 {
			continue
		}
		from := rel(parts[0])
		fk := kind(from)
		if fk == "internal-other" {
			t.Errorf("%s: every internal package belongs under internal/app, internal/lib, internal/testkit or internal/e2e", from)
			continue
		}
		check := func(imports string, kinds []string, what string) {
			for _, imp := range strings.Fields(imports) {
				if !strings.HasPrefix(imp, module+"/") && imp != module {
					continue
				}
				to := rel(imp)
				tk := kind(to)
				if to == from {
					continue
				}
				if !contains(kinds, tk) {
					t.Errorf("%s (%s) %s %s (%s): not allowed; see docs/architecture.md", from, fk, what, to, tk)
				}
				checked++
			}
		}
		check(parts[1], allowed[fk], "imports")
		if standalone[from] {
			for _, imp := range strings.Fields(parts[1]) {
				if kind(rel(imp)) == "app" && strings.HasPrefix(imp, module+"/") {
					t.Errorf("%s imports %s: it stands alone, importing no application package; see docs/architecture.md", from, rel(imp))
				}
			}
		}
		check(parts[2], append(append([]string(nil), allowed[fk]...), testExtra[fk]...), "imports in tests")
	}
	if checked == 0 {
		t.Fatal("no imports were checked: go list printed nothing usable")
	}
}

// standalone are the application packages that import no other: the
// gateway's upstream client, which the gateway's fast stack uses through
// its RoundTrip and which can be measured, replaced or removed alone.
var standalone = map[string]bool{
	"internal/app/gateway/upstream": true,
}

func rel(path string) string {
	if path == module {
		return ""
	}
	return strings.TrimPrefix(path, module+"/")
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
