// Package options checks, by compiling small programs, that the transports'
// options cannot be given to the wrong role.
package options

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// goTool returns the go command of the toolchain running the test: go test
// puts its GOROOT/bin first in the test's PATH.
func goTool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not available: cannot compile the test programs")
	}
	return p
}

// build compiles the program in testdata/dir and returns the compiler's
// output and whether it compiled.
func build(t *testing.T, goCmd, dir string) (string, bool) {
	t.Helper()
	cmd := exec.Command(goCmd, "build", "-o", os.DevNull, "./testdata/"+dir)
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

// TestOptionsCannotBeMisused: each role of laneshttp and lanesgrpc takes its
// own option type, so a client option given to a server, or a server option
// to a client, is a type error; the options that mean the same on both sides
// go to either.
func TestOptionsCannotBeMisused(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles programs")
	}
	goCmd := goTool(t)
	if out, ok := build(t, goCmd, "both"); !ok {
		t.Fatalf("the program that uses each option in its role does not compile:\n%s", out)
	}
	for _, tc := range []struct {
		dir, option, want string
	}{
		{"http_client_to_server", "laneshttp.WithRetries(2)", "does not implement laneshttp.ServerOption (missing method ApplyServer)"},
		{"http_server_to_client", "laneshttp.WithTTL(time.Second)", "does not implement laneshttp.ClientOption (missing method ApplyClient)"},
		{"grpc_client_to_server", `lanesgrpc.WithIdempotent("/a.B/C")`, "does not implement lanesgrpc.ServerOption (missing method ApplyServer)"},
		{"grpc_server_to_client", "lanesgrpc.WithGuard(nil)", "does not implement lanesgrpc.ClientOption (missing method ApplyClient)"},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			out, ok := build(t, goCmd, tc.dir)
			if ok {
				t.Fatalf("%s compiled; want a type error", tc.option)
			}
			if !strings.Contains(out, tc.option) || !strings.Contains(out, tc.want) {
				t.Fatalf("the compiler said:\n%s\nwant an error about %s that says %q", out, tc.option, tc.want)
			}
		})
	}
}
