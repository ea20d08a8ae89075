// Package childproc runs a program as a child of an end-to-end test: the
// lanes binary, a service in another language, a program of the docs. The
// test reads the child's output as it runs, waits until it prints a line,
// signals it and reads its exit code. A child that still runs at the
// test's end is stopped, and its output is logged when the test failed.
//
// proctest supervises the server programs (etcd, nats-server) that test
// kits start, stop, restart and pause behind a readiness check; a Child is
// one run of a program that the test itself drives by what it prints.
package childproc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/testkit/buftest"
	"github.com/lanesdev/lanes/internal/testkit/leaktest"
)

// DefaultWait bounds the waits of a Spec that gives no Wait.
const DefaultWait = 60 * time.Second

// poll is how often WaitOutput and WaitMatch read the output again.
const poll = 20 * time.Millisecond

// Spec says how to run one child.
type Spec struct {
	Name string   // for messages, such as "lanes up"
	Argv []string // the program and its arguments
	Dir  string   // the working folder; "" for the test's own
	// Env is added to the test's environment less its LANES_* variables
	// and Drop's (see Environ).
	Env []string
	// Drop lists more prefixes of variables to leave out of the test's
	// environment, such as "HTTP_PROXY=".
	Drop []string
	// ExtraFiles become the child's descriptors 3, 4, ...
	ExtraFiles []*os.File
	// OneStream writes stderr into Stdout's buffer too, as a terminal
	// shows both in the order written; Stderr then stays empty.
	OneStream bool
	// Wait bounds WaitOutput, WaitMatch, WaitExit and Stop; DefaultWait
	// when zero.
	Wait time.Duration
	// Tail is how many bytes of stderr's end (of the one stream's, with
	// OneStream) the messages and the log on failure show; all when zero.
	Tail int
	// StopSignal ends the child at the test's cleanup when it still runs:
	// SIGKILL when zero; with another signal the child has Wait to exit
	// before it is killed.
	StopSignal syscall.Signal
}

// Child is a running child process.
type Child struct {
	// Stdout and Stderr hold what the child printed so far.
	Stdout, Stderr buftest.Buffer

	t      testing.TB
	spec   Spec
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // of Wait, written before exited is closed
}

// Start starts the child described by spec, or fails the test. At the
// test's cleanup the child is stopped if it still runs (see
// Spec.StopSignal), and its output is logged when the test failed.
func Start(t testing.TB, spec Spec) *Child {
	t.Helper()
	if len(spec.Argv) == 0 {
		t.Fatalf("childproc: %s: no program to run", spec.Name)
	}
	if spec.Wait == 0 {
		spec.Wait = DefaultWait
	}
	c := &Child{t: t, spec: spec, exited: make(chan struct{})}
	c.cmd = exec.Command(spec.Argv[0], spec.Argv[1:]...)
	c.cmd.Dir = spec.Dir
	c.cmd.Env = append(Environ(spec.Drop...), spec.Env...)
	c.cmd.ExtraFiles = spec.ExtraFiles
	c.cmd.Stdout, c.cmd.Stderr = &c.Stdout, &c.Stderr
	if spec.OneStream {
		c.cmd.Stderr = &c.Stdout
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { // ends when the process does
		c.err = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		sig := spec.StopSignal
		if sig == 0 {
			sig = syscall.SIGKILL
		}
		c.end(sig)
		if t.Failed() {
			t.Logf("%s %s", spec.Name, c.output())
		}
	})
	return c
}

// Name is the child's name in messages.
func (c *Child) Name() string { return c.spec.Name }

// Pid is the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Signal sends sig to the child.
func (c *Child) Signal(sig syscall.Signal) error { return c.cmd.Process.Signal(sig) }

// Exited is closed once the child has exited and all its output is in
// Stdout and Stderr.
func (c *Child) Exited() <-chan struct{} { return c.exited }

// Err is how the child ended, as exec.Cmd.Wait says it, once it has
// exited; nil before.
func (c *Child) Err() error {
	select {
	case <-c.exited:
		return c.err
	default:
		return nil
	}
}

// ExitCode is the child's exit code once it has exited (-1 when a signal
// ended it), and -1 before.
func (c *Child) ExitCode() int {
	select {
	case <-c.exited:
		return ExitCode(c.err)
	default:
		return -1
	}
}

// WaitOutput waits until stdout contains s, and returns stdout. It fails
// the test when the child exits first or Spec.Wait passes.
func (c *Child) WaitOutput(s string) string {
	c.t.Helper()
	var out string
	c.waitFor(fmt.Sprintf("%q", s), func(o string) bool {
		out = o
		return strings.Contains(o, s)
	})
	return out
}

// WaitMatch waits until stdout matches re, and returns the submatches (see
// regexp.Regexp.FindStringSubmatch). It fails the test as WaitOutput does.
func (c *Child) WaitMatch(re *regexp.Regexp) []string {
	c.t.Helper()
	var m []string
	c.waitFor(fmt.Sprintf("%q", re), func(o string) bool {
		m = re.FindStringSubmatch(o)
		return m != nil
	})
	return m
}

// waitFor polls stdout until done holds. Once the child has exited, its
// output is complete: done has one last look before the test fails.
func (c *Child) waitFor(what string, done func(stdout string) bool) {
	c.t.Helper()
	deadline := time.After(c.spec.Wait)
	for {
		if done(c.Stdout.String()) {
			return
		}
		select {
		case <-c.exited:
			if !done(c.Stdout.String()) {
				c.t.Fatalf("%s exited (%v) before printing %s:\n%s", c.spec.Name, c.err, what, c.output())
			}
			return
		case <-deadline:
			c.t.Fatalf("%s did not print %s within %s:\n%s", c.spec.Name, what, c.spec.Wait, c.output())
		case <-time.After(poll):
		}
	}
}

// WaitExit waits until the child exits by itself, and fails the test when
// it still runs after Spec.Wait.
func (c *Child) WaitExit() {
	c.t.Helper()
	select {
	case <-c.exited:
	case <-time.After(c.spec.Wait):
		c.t.Fatalf("%s still runs after %s:\n%s", c.spec.Name, c.spec.Wait, c.output())
	}
}

// Stop sends sig and waits for the child to exit, and returns its exit
// code (see ExitCode). A child that does not exit within Spec.Wait is
// killed, and the test marked failed.
func (c *Child) Stop(sig syscall.Signal) int {
	c.t.Helper()
	if !c.end(sig) {
		c.t.Errorf("%s did not stop within %s of %v", c.spec.Name, c.spec.Wait, sig)
	}
	return c.ExitCode()
}

// Kill sends SIGKILL, as a crash would end the child, and waits for its
// end.
func (c *Child) Kill() { c.end(syscall.SIGKILL) }

// end sends sig unless the child has exited, and waits for the exit: at
// most Spec.Wait, then it kills the child and reports false.
func (c *Child) end(sig syscall.Signal) bool {
	select {
	case <-c.exited:
		return true
	default:
	}
	c.cmd.Process.Signal(sig)
	if sig == syscall.SIGKILL {
		<-c.exited
		return true
	}
	select {
	case <-c.exited:
		return true
	case <-time.After(c.spec.Wait):
		c.cmd.Process.Kill()
		<-c.exited
		return false
	}
}

// output is what the child printed, for a message: stdout and the tail of
// stderr apart, or the tail of the one stream.
func (c *Child) output() string {
	if c.spec.OneStream {
		return "output:\n" + c.tail(c.Stdout.String())
	}
	return "stdout:\n" + c.Stdout.String() + "\nstderr:\n" + c.tail(c.Stderr.String())
}

func (c *Child) tail(s string) string {
	if c.spec.Tail == 0 {
		return s
	}
	return Tail(s, c.spec.Tail)
}

// Tail is the last n bytes of s, marked with "..." when s is longer.
func Tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// Environ is the test's environment without its LANES_* variables, which
// would configure a lanes program behind the test's back, nor those whose
// names begin with one of drop, in any case (HTTP_PROXY also drops
// http_proxy).
func Environ(drop ...string) []string {
	var env []string
next:
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "LANES_") {
			continue
		}
		for _, d := range drop {
			if len(kv) >= len(d) && strings.EqualFold(kv[:len(d)], d) {
				continue next
			}
		}
		env = append(env, kv)
	}
	return env
}

// ExitCode is the exit code in err, an error of exec.Cmd's Run or Wait: 0
// for nil, -1 when the program did not run or a signal ended it.
func ExitCode(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	return -1
}

// BuildLanes builds cmd/lanes into a new temporary folder, for a TestMain:
// it returns the binary's path and a cleanup that removes the folder.
func BuildLanes() (bin string, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "lanes-e2e-")
	if err != nil {
		return "", nil, err
	}
	bin = filepath.Join(dir, "lanes")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/lanesdev/lanes/cmd/lanes").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}

// Run runs m's tests and, when they passed, checks that they left no
// goroutine running (goleak, with leaktest's options); it returns the code
// for os.Exit.
func Run(m *testing.M) int {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(leaktest.Options()...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	return code
}

// Main is the TestMain of a package whose tests run the lanes binary: it
// builds it (see BuildLanes), sets *lanes to its path, runs the tests (see
// Run), removes the binary and exits.
func Main(m *testing.M, lanes *string) {
	bin, cleanup, err := BuildLanes()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*lanes = bin
	code := Run(m)
	cleanup()
	os.Exit(code)
}
