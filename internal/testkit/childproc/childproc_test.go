package childproc

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// roleEnv makes the test binary one of the children below.
const roleEnv = "CHILDPROC_TEST_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "":
		os.Exit(Run(m))
	case "serve": // ready, then exit 3 on SIGTERM
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		fmt.Fprintln(os.Stderr, "a note")
		fmt.Println("ready")
		<-sig
		os.Exit(3)
	case "print": // print and exit at once
		fmt.Println("done")
		fmt.Fprintln(os.Stderr, "to stderr")
		os.Exit(0)
	case "fail":
		os.Exit(2)
	case "env":
		fmt.Println(strings.Join(os.Environ(), "\n"))
		os.Exit(0)
	}
	os.Exit(99)
}

// child starts the test binary in role.
func child(t testing.TB, role string, spec Spec) *Child {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	spec.Name = role
	spec.Argv = []string{self}
	// The race detector's runtime waits a second at a program's exit,
	// for reports from other threads; these children have none.
	spec.Env = append(spec.Env, roleEnv+"="+role, "GORACE=atexit_sleep_ms=0")
	return Start(t, spec)
}

func TestStop(t *testing.T) {
	c := child(t, "serve", Spec{})
	c.WaitOutput("ready")
	if code := c.Stop(syscall.SIGTERM); code != 3 {
		t.Errorf("exit code %d after SIGTERM, want 3", code)
	}
	if !c.Stderr.Contains("a note") {
		t.Errorf("stderr %q, want a note", c.Stderr.String())
	}
	if c.Stdout.Contains("a note") {
		t.Errorf("stdout %q holds stderr's line", c.Stdout.String())
	}
}

// TestOutputThenExit: a child that prints and exits at once has printed,
// whichever of the two WaitOutput sees first.
func TestOutputThenExit(t *testing.T) {
	for range 20 {
		c := child(t, "print", Spec{OneStream: true})
		c.WaitOutput("done")
		c.WaitOutput("to stderr")
		c.WaitExit()
		if c.ExitCode() != 0 || c.Err() != nil {
			t.Fatalf("exit %d (%v), want 0", c.ExitCode(), c.Err())
		}
	}
}

// fatal records the test's end, as testing.T's Fatalf does.
type fatal struct {
	testing.TB
	msg string
}

func (f *fatal) Helper() {}

func (f *fatal) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestExitBeforePrinting(t *testing.T) {
	f := &fatal{TB: t}
	c := child(f, "fail", Spec{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.WaitOutput("never")
	}()
	<-done
	if want := `fail exited (exit status 2) before printing "never"`; !strings.HasPrefix(f.msg, want) {
		t.Errorf("WaitOutput failed with %q, want %q", f.msg, want)
	}
	if c.ExitCode() != 2 {
		t.Errorf("exit code %d, want 2", c.ExitCode())
	}
}

func TestEnviron(t *testing.T) {
	t.Setenv("LANES_FROM_TEST", "1")
	t.Setenv("http_proxy", "http://127.0.0.1:9")
	t.Setenv("CHILDPROC_KEPT", "1")
	c := child(t, "env", Spec{Env: []string{"LANES_GIVEN=1"}, Drop: []string{"HTTP_PROXY="}})
	c.WaitExit()
	env := "\n" + c.Stdout.String()
	for v, want := range map[string]bool{"LANES_FROM_TEST": false, "http_proxy": false, "CHILDPROC_KEPT": true, "LANES_GIVEN": true} {
		if got := strings.Contains(env, "\n"+v+"="); got != want {
			t.Errorf("%s in the child's environment: %v, want %v", v, got, want)
		}
	}
}

func TestExitCode(t *testing.T) {
	if got := ExitCode(nil); got != 0 {
		t.Errorf("ExitCode(nil) = %d", got)
	}
	if got := ExitCode(os.ErrNotExist); got != -1 {
		t.Errorf("ExitCode(not an exit) = %d", got)
	}
}
