package natstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// SkipMessage is the reason tests are skipped when there is no nats-server
// binary.
const SkipMessage = "nats-server binary not found on PATH or in /usr/sbin; install Debian's nats-server (the CI script does)"

// Binary returns the path of the nats-server binary: $LANES_NATS_BINARY when
// set (set it to a path that does not exist to skip the process tests), else
// nats-server on PATH, else /usr/sbin/nats-server (where Debian's package
// installs it, often not on PATH). It returns "" when there is none.
func Binary() string {
	if p := os.Getenv("LANES_NATS_BINARY"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return ""
		}
		return p
	}
	if p, err := exec.LookPath("nats-server"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/nats-server", "/usr/local/sbin/nats-server", "/usr/local/bin/nats-server"} {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p
		}
	}
	return ""
}

// Proc is a nats-server process with JetStream on a loopback port, its
// store in a temporary directory.
type Proc struct {
	t       testing.TB
	bin     string
	dir     string // store directory
	portDir string // where the server writes its ports file
	logPath string
	port    int // 0 until the first start picked one

	mu     sync.Mutex
	cmd    *exec.Cmd     // nil while stopped
	exited chan struct{} // closed when cmd has been waited for
}

var _ Server = (*Proc)(nil)

// Process starts a nats-server process for the test, or skips the test with
// SkipMessage when the binary is absent. The process is killed at cleanup;
// its log is printed when the test failed.
func Process(t testing.TB) *Proc {
	t.Helper()
	bin := Binary()
	if bin == "" {
		t.Skip(SkipMessage)
	}
	tmp := t.TempDir()
	p := &Proc{t: t, bin: bin, dir: filepath.Join(tmp, "store"), portDir: filepath.Join(tmp, "ports"), logPath: filepath.Join(tmp, "nats.log")}
	if err := os.MkdirAll(p.portDir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			p.dumpLog()
		}
	})
	if err := p.Start(); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return p
}

func (p *Proc) Kind() string { return "process" }

// URL returns the client URL of the process; it does not change over
// restarts.
func (p *Proc) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(p.port) }

// Start starts the stopped process again on the same store directory and
// port, and waits until it accepts clients with JetStream on. The first
// start lets the server pick a free port as it binds.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return nil
	}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own copy
	fmt.Fprintf(logf, "--- natstest: starting %s at %s\n", p.bin, time.Now().Format(time.RFC3339Nano))
	port := "-1"
	if p.port != 0 {
		port = strconv.Itoa(p.port)
	}
	cmd := exec.Command(p.bin,
		"--name", "lanes-test",
		"-a", "127.0.0.1",
		"-p", port,
		"-js",
		"-sd", p.dir,
		"--ports_file_dir", p.portDir,
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	setPdeathsig(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.bin, err)
	}
	exited := make(chan struct{})
	go func() { // owned by p: Stop and Kill wait for it
		cmd.Wait()
		close(exited)
	}()
	p.cmd, p.exited = cmd, exited

	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	if err := p.waitReady(ctx, cmd.Process.Pid, exited); err != nil {
		p.stopLocked(syscall.SIGKILL)
		return fmt.Errorf("nats-server: %w (log: %s)", err, p.logTail(2048))
	}
	return nil
}

// waitReady waits for the ports file of pid, then for JetStream to answer.
func (p *Proc) waitReady(ctx context.Context, pid int, exited <-chan struct{}) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	ports := filepath.Join(p.portDir, filepath.Base(p.bin)+"_"+strconv.Itoa(pid)+".ports")
	for {
		if p.port == 0 {
			if b, err := os.ReadFile(ports); err == nil {
				var pf struct {
					Nats []string `json:"nats"`
				}
				if json.Unmarshal(b, &pf) == nil && len(pf.Nats) > 0 {
					u := pf.Nats[0]
					if i := strings.LastIndex(u, ":"); i >= 0 {
						p.port, _ = strconv.Atoi(u[i+1:])
					}
				}
			}
		}
		if p.port != 0 && jetStreamUp(p.URL()) {
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited while starting")
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// jetStreamUp reports whether the server at url accepts a client and
// answers a JetStream account request.
func jetStreamUp(url string) bool {
	nc, err := nats.Connect(url, nats.Timeout(time.Second), nats.NoReconnect())
	if err != nil {
		return false
	}
	defer nc.Close()
	_, err = nc.Request("$JS.API.INFO", nil, time.Second)
	return err == nil
}

// Stop sends SIGTERM and waits for the process to exit.
func (p *Proc) Stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopLocked(syscall.SIGTERM)
}

// Kill sends SIGKILL and waits for the process to exit: JetStream loses
// what it had not written to its files, as in a crash of the process.
func (p *Proc) Kill() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopLocked(syscall.SIGKILL)
}

func (p *Proc) stopLocked(sig syscall.Signal) error {
	if p.cmd == nil {
		return nil
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
	p.cmd, p.exited = nil, nil
	return nil
}

// Restart stops the process cleanly and starts it again.
func (p *Proc) Restart() error {
	if err := p.Stop(); err != nil {
		return err
	}
	return p.Start()
}

func (p *Proc) logTail(n int) string {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func (p *Proc) dumpLog() {
	p.t.Logf("nats-server process log (tail):\n%s", p.logTail(8192))
}
