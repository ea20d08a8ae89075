// Package proctest runs a real server program (etcd, nats-server) as a child
// process of a test: it finds the binary, starts the process with its output
// in a log file, waits until the caller's readiness check passes, and stops,
// kills, restarts, pauses (SIGSTOP) or resumes (SIGCONT) it. The log's tail
// is printed when the test fails.
//
// The etcdtest and natstest helpers build on it.
package proctest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Find returns the path of a server binary: the file named by the
// environment variable envVar when it is set (set it to a path that does not
// exist to skip the process tests), else name on PATH, else the first of
// fallbacks that exists. It returns "" when there is none.
func Find(envVar, name string, fallbacks ...string) string {
	if p := os.Getenv(envVar); p != "" {
		if _, err := os.Stat(p); err != nil {
			return ""
		}
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, p := range fallbacks {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p
		}
	}
	return ""
}

// Spec says how to run one server process.
type Spec struct {
	Name    string // for messages, such as "etcd"
	Bin     string
	LogPath string
	// Args returns the command-line arguments; it is called at every start,
	// so that a restart can reuse what the first start found (a port).
	Args func() []string
	// Env is the child's environment; nil inherits the test's.
	Env []string
	// Ready blocks until the process with the given pid serves, ctx is done
	// or exited is closed. It is called with the process's lock held.
	Ready   func(ctx context.Context, pid int, exited <-chan struct{}) error
	Timeout time.Duration // for Ready
}

// Proc is a supervised server process. Its methods are safe for concurrent
// use.
type Proc struct {
	t    testing.TB
	spec Spec

	mu     sync.Mutex
	cmd    *exec.Cmd     // nil while stopped
	exited chan struct{} // closed when cmd has been waited for
	sent   *atomic.Value // the syscall.Signal that Stop or Kill sent to cmd
	paused bool          // SIGSTOPped by Pause
}

// New returns a stopped process. At the test's cleanup the process is killed
// and, when the test failed, the tail of its log is printed.
func New(t testing.TB, spec Spec) *Proc {
	p := &Proc{t: t, spec: spec}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("%s process log (tail):\n%s", spec.Name, p.LogTail(8192))
		}
	})
	return p
}

// Start starts the stopped process and waits until it is ready. A process
// that does not become ready is killed.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return nil
	}
	logf, err := os.OpenFile(p.spec.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own copy
	fmt.Fprintf(logf, "--- proctest: starting %s at %s\n", p.spec.Bin, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.spec.Bin, p.spec.Args()...)
	cmd.Env = p.spec.Env
	cmd.Stdout, cmd.Stderr = logf, logf
	setPdeathsig(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.spec.Bin, err)
	}
	exited := make(chan struct{})
	// The signal that stopLocked sent, if any.
	sent := new(atomic.Value)
	go func() { // owned by p: Stop and Kill wait for it
		err := cmd.Wait()
		// How the process ended, in its log: a death that no one here
		// asked for (another program's signal, the OOM killer, a crash)
		// is told apart from a Stop or Kill.
		by := "not by proctest"
		if sig, ok := sent.Load().(syscall.Signal); ok {
			by = fmt.Sprintf("after proctest sent signal %d (%v)", int(sig), sig)
		}
		if f, ferr := os.OpenFile(p.spec.LogPath, os.O_WRONLY|os.O_APPEND, 0o600); ferr == nil {
			fmt.Fprintf(f, "--- proctest: pid %d ended at %s, %s: %v\n", cmd.Process.Pid, time.Now().Format(time.RFC3339Nano), by, exitText(cmd, err))
			f.Close()
		}
		close(exited)
	}()
	p.cmd, p.exited, p.sent = cmd, exited, sent

	ctx, cancel := context.WithTimeout(context.Background(), p.spec.Timeout)
	defer cancel()
	if err := p.spec.Ready(ctx, cmd.Process.Pid, exited); err != nil {
		p.stopLocked(syscall.SIGKILL)
		return fmt.Errorf("%s: %w (log: %s)", p.spec.Name, err, p.LogTail(2048))
	}
	return nil
}

// exitText says how cmd ended: its exit status or the signal that ended it
// (with the error of Wait when there is no status).
func exitText(cmd *exec.Cmd, err error) string {
	if cmd.ProcessState == nil {
		return fmt.Sprint(err)
	}
	return cmd.ProcessState.String()
}

// Stop sends SIGTERM and waits for the process to exit.
func (p *Proc) Stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopLocked(syscall.SIGTERM)
}

// Kill sends SIGKILL and waits for the process to exit, as in a crash.
func (p *Proc) Kill() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopLocked(syscall.SIGKILL)
}

func (p *Proc) stopLocked(sig syscall.Signal) error {
	if p.cmd == nil {
		return nil
	}
	p.sent.Store(sig)
	p.cmd.Process.Signal(sig)
	if p.paused {
		// A stopped process acts on SIGTERM only once it runs again.
		p.cmd.Process.Signal(sigCont)
		p.paused = false
	}
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.sent.Store(syscall.SIGKILL)
		p.cmd.Process.Kill()
		<-p.exited
	}
	p.cmd, p.exited = nil, nil
	return nil
}

// Pause stops the running process with SIGSTOP, as a hung or descheduled
// server: it keeps its sockets open, the kernel still accepts connections
// and buffers what clients send, and nothing answers. Resume undoes it.
func (p *Proc) Pause() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s: pause: not running", p.spec.Name)
	}
	if err := p.cmd.Process.Signal(sigStop); err != nil {
		return fmt.Errorf("%s: pause: %w", p.spec.Name, err)
	}
	p.paused = true
	return nil
}

// Resume continues a paused process with SIGCONT.
func (p *Proc) Resume() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s: resume: not running", p.spec.Name)
	}
	if err := p.cmd.Process.Signal(sigCont); err != nil {
		return fmt.Errorf("%s: resume: %w", p.spec.Name, err)
	}
	p.paused = false
	return nil
}

// Running reports whether the process runs (paused or not).
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

// Paused reports whether the process is paused.
func (p *Proc) Paused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused
}

// Restart stops the process cleanly and starts it again.
func (p *Proc) Restart() error {
	if err := p.Stop(); err != nil {
		return err
	}
	return p.Start()
}

// LogTail returns the last n bytes of the process's log.
func (p *Proc) LogTail(n int) string {
	b, _ := os.ReadFile(p.spec.LogPath)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// LogContains reports whether the process's log contains s.
func (p *Proc) LogContains(s string) bool {
	b, _ := os.ReadFile(p.spec.LogPath)
	return bytes.Contains(b, []byte(s))
}

// FreeAddr returns a loopback host:port that was free a moment ago, for a
// server that must be told its port before it starts (a cluster member
// whose peers need its address). Another process may take it meanwhile: a
// caller retries on other ports when the server cannot bind.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// CPUTime returns the CPU time (user and system) that the running process
// has used, from /proc (Linux only), at the kernel's 10 ms resolution.
func (p *Proc) CPUTime() (time.Duration, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0, fmt.Errorf("%s: cpu time: not running", p.spec.Name)
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0, fmt.Errorf("%s: cpu time: %w", p.spec.Name, err)
	}
	// The fields after the command (which may hold spaces) in parentheses:
	// state is the first, utime and stime the 12th and 13th, in clock ticks
	// of 1/100 s (the USER_HZ of /proc).
	f := bytes.Fields(stat[bytes.LastIndexByte(stat, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("%s: cpu time: unexpected /proc stat %q", p.spec.Name, stat)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: cpu time: unexpected /proc stat %q", p.spec.Name, stat)
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// WaitOwner returns nil when the process pid listens on addr (see
// Listens). Otherwise another process answers there, having taken the
// port first, and pid is failing to bind it: WaitOwner waits until pid has
// exited (or ctx ends) and says so. A child's readiness check calls it
// once the child's port answers.
func WaitOwner(ctx context.Context, pid int, addr string, exited <-chan struct{}) error {
	if ours, _ := Listens(pid, addr); ours {
		return nil
	} // not ours, or pid gone from /proc: it exits, or has
	select {
	case <-exited:
		return fmt.Errorf("another process answers on %s", addr)
	case <-ctx.Done():
		return fmt.Errorf("another process answers on %s: %w", addr, ctx.Err())
	}
}
