package etcdtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// SkipMessage is the reason tests are skipped when there is no etcd binary.
const SkipMessage = "etcd server binary not found on PATH; install Debian's etcd-server (the CI script does)"

// Binary returns the path of the etcd server binary: $LANES_ETCD_BINARY when
// set (set it to a path that does not exist to skip the process tests), else
// etcd on PATH, else /usr/bin/etcd. It returns "" when there is none.
func Binary() string {
	if p := os.Getenv("LANES_ETCD_BINARY"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return ""
		}
		return p
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/etcd"); err == nil {
		return "/usr/bin/etcd"
	}
	return ""
}

// Proc is an etcd server process: a single member on loopback ports with its
// data in a temporary directory (on /dev/shm when possible, for speed).
type Proc struct {
	t          testing.TB
	bin        string
	dir        string
	logPath    string
	clientAddr string
	peerAddr   string

	mu     sync.Mutex
	cmd    *exec.Cmd     // nil while stopped
	exited chan struct{} // closed when cmd has been waited for
}

var _ Server = (*Proc)(nil)

// Process starts an etcd server process for the test, or skips the test
// with SkipMessage when the etcd binary is absent. The process is killed at
// cleanup; its log is printed when the test failed.
func Process(t testing.TB) *Proc {
	t.Helper()
	bin := Binary()
	if bin == "" {
		t.Skip(SkipMessage)
	}
	tmp := t.TempDir()
	data := tmpfsDir(t)
	if data == "" {
		data = tmp
	}
	p := &Proc{t: t, bin: bin, dir: filepath.Join(data, "data"), logPath: filepath.Join(tmp, "etcd.log")}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			p.dumpLog()
		}
	})
	var err error
	for range 5 {
		if p.clientAddr, err = freePort(); err != nil {
			break
		}
		if p.peerAddr, err = freePort(); err != nil {
			break
		}
		if err = p.Start(); err == nil {
			return p
		}
		// Another process may have taken a port between our check and
		// etcd's bind; try other ports.
		if !p.logContains("address already in use") {
			break
		}
	}
	t.Fatalf("etcdtest: %v", err)
	return nil
}

func (p *Proc) Kind() string { return "process" }

// Endpoints returns the client URL of the process; it does not change over
// restarts.
func (p *Proc) Endpoints() []string { return []string{"http://" + p.clientAddr} }

// Start starts the stopped process again on the same data directory and
// ports and waits until it reports healthy.
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
	fmt.Fprintf(logf, "--- etcdtest: starting %s at %s\n", p.bin, time.Now().Format(time.RFC3339Nano))
	curl, purl := "http://"+p.clientAddr, "http://"+p.peerAddr
	cmd := exec.Command(p.bin,
		"--name", "lanes-test",
		"--data-dir", p.dir,
		"--listen-client-urls", curl,
		"--advertise-client-urls", curl,
		"--listen-peer-urls", purl,
		"--initial-advertise-peer-urls", purl,
		"--initial-cluster", "lanes-test="+purl,
		"--initial-cluster-state", "new",
		"--logger", "zap",
		"--log-outputs", "stderr",
		"--log-level", "warn",
		// A fast election makes starts and restarts take a fraction of a
		// second instead of two; a single member has no peers to miss.
		"--heartbeat-interval", "10",
		"--election-timeout", "100",
	)
	cmd.Env = childEnv()
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
	if err := waitHealthy(ctx, curl, exited); err != nil {
		p.stopLocked(syscall.SIGKILL)
		return fmt.Errorf("etcd at %s: %w (log: %s)", curl, err, p.logTail(2048))
	}
	return nil
}

// childEnv is the test's environment without ETCD_* variables, which etcd
// would read as flags.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") {
			env = append(env, kv)
		}
	}
	if runtime.GOARCH != "amd64" {
		env = append(env, "ETCD_UNSUPPORTED_ARCH="+runtime.GOARCH)
	}
	return env
}

func waitHealthy(ctx context.Context, curl string, exited <-chan struct{}) error {
	hc := &http.Client{Timeout: time.Second}
	defer hc.CloseIdleConnections()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, curl+"/health", nil)
		if resp, err := hc.Do(req); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && bytes.Contains(body, []byte(`"true"`)) {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("exited while starting")
		case <-ctx.Done():
			return fmt.Errorf("not healthy: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// Stop sends SIGTERM and waits for the process to exit.
func (p *Proc) Stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopLocked(syscall.SIGTERM)
}

// Kill sends SIGKILL and waits for the process to exit.
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

func (p *Proc) logContains(s string) bool {
	b, _ := os.ReadFile(p.logPath)
	return bytes.Contains(b, []byte(s))
}

func (p *Proc) dumpLog() {
	p.t.Logf("etcd process log (tail):\n%s", p.logTail(8192))
}
