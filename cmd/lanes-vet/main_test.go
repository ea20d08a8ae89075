package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestVettool builds lanes-vet and runs it under go vet -vettool, and as a multichecker, on the
// test module of lanes vet.
func TestVettool(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is not on PATH")
	}
	bin := filepath.Join(t.TempDir(), "lanes-vet")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	mod, err := filepath.Abs("../../internal/app/cli/testdata/vetmod")
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"go", "vet", "-vettool=" + bin, "./dirty"},
		{bin, "./dirty"},
	} {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir = mod
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("%s: exit 0, want findings:\n%s", strings.Join(args, " "), out)
		}
		for _, want := range []string{"dirty.go:12:11: context.Background() drops the lane", "dirty.go:13:12: http.NewRequest builds a request"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("%s: output lacks %q:\n%s", strings.Join(args, " "), want, out)
			}
		}
		clean := exec.Command(args[0], append(args[1:len(args)-1], "./clean")...)
		clean.Dir = mod
		if out, err := clean.CombinedOutput(); err != nil {
			t.Errorf("%s ./clean: %v\n%s", strings.Join(args[:len(args)-1], " "), err, out)
		}
	}
}
