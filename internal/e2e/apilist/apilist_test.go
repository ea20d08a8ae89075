package apilist

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata from the source")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// golden is the file that holds the listing of the package in dir.
func golden(dir string) string {
	return filepath.Join("testdata", strings.ReplaceAll(dir, "/", "_")+".txt")
}

// TestAPI compares the exported API of every public package with its golden file.
func TestAPI(t *testing.T) {
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := Packages(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatal("no public package found under " + root)
	}
	want := map[string]bool{}
	var table strings.Builder
	var total Count
	fmt.Fprintf(&table, "%-14s %9s %7s %6s %5s\n", "package", "top-level", "methods", "fields", "total")
	for _, dir := range dirs {
		lines, n, err := List(root, dir)
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		total.TopLevel += n.TopLevel
		total.Methods += n.Methods
		total.Fields += n.Fields
		fmt.Fprintf(&table, "%-14s %9d %7d %6d %5d\n", dir, n.TopLevel, n.Methods, n.Fields, n.Total())
		file := golden(dir)
		want[filepath.Base(file)] = true
		got := strings.Join(lines, "\n") + "\n"
		if *update {
			if err := os.MkdirAll("testdata", 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Errorf("%s: a new public package has no golden file (%v).\n"+
				"A new export is a decision: run go test ./internal/e2e/apilist -update and review the diff.", dir, err)
			continue
		}
		if d := diff(strings.Split(strings.TrimSuffix(string(b), "\n"), "\n"), lines); d != "" {
			t.Errorf("%s: the exported API differs from %s (- golden, + source):\n%s"+
				"A new export is a decision: run go test ./internal/e2e/apilist -update and review the diff.",
				dir, file, d)
		}
	}
	fmt.Fprintf(&table, "%-14s %9d %7d %6d %5d\n", "total", total.TopLevel, total.Methods, total.Fields, total.Total())
	t.Logf("exported identifiers:\n%s", table.String())
	entries, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !want[e.Name()] {
			if *update {
				if err := os.Remove(filepath.Join("testdata", e.Name())); err != nil {
					t.Fatal(err)
				}
				continue
			}
			t.Errorf("testdata/%s lists a package that is no longer public: run go test ./internal/e2e/apilist -update", e.Name())
		}
	}
}

// diff lists the lines of a and b (both sorted) that the other lacks.
func diff(a, b []string) string {
	var out strings.Builder
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i] < b[j]):
			fmt.Fprintf(&out, "\t- %s\n", a[i])
			i++
		case i == len(a) || b[j] < a[i]:
			fmt.Fprintf(&out, "\t+ %s\n", b[j])
			j++
		default:
			i++
			j++
		}
	}
	return out.String()
}
