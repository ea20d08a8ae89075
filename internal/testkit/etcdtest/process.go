package etcdtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/proctest"
)

// SkipMessage is the reason tests are skipped when there is no etcd binary.
const SkipMessage = "etcd server binary not found on PATH; install Debian's etcd-server (the CI script does)"

// Binary returns the path of the etcd server binary: $LANES_ETCD_BINARY when
// set (set it to a path that does not exist to skip the process tests), else
// etcd on PATH, else /usr/bin/etcd. It returns "" when there is none.
func Binary() string {
	return proctest.Find("LANES_ETCD_BINARY", "etcd", "/usr/bin/etcd")
}

// Proc is an etcd server process: a single member on loopback ports with its
// data in a temporary directory (on /dev/shm when possible, for speed).
type Proc struct {
	*proctest.Proc // Start, Stop, Kill, Restart
	dir            string
	clientAddr     string
	peerAddr       string
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
	p := &Proc{dir: filepath.Join(data, "data")}
	p.Proc = proctest.New(t, proctest.Spec{
		Name:    "etcd",
		Bin:     bin,
		LogPath: filepath.Join(tmp, "etcd.log"),
		Args:    p.args,
		Env:     childEnv(),
		Ready: func(ctx context.Context, pid int, exited <-chan struct{}) error {
			hc := &http.Client{Timeout: time.Second} //lanes:ignore the health probe of an etcd process, outside lanes
			defer hc.CloseIdleConnections()
			return waitHealthy(ctx, hc, pid, p.clientAddr, "http://"+p.clientAddr, exited)
		},
		Timeout: StartTimeout,
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
		// etcd's bind; try other ports, on an empty data directory (a
		// member that had started keeps its old peer URL there).
		if !p.LogContains("address already in use") {
			break
		}
		if err := os.RemoveAll(p.dir); err != nil {
			t.Fatalf("etcdtest: %v", err)
		}
	}
	t.Fatalf("etcdtest: %v", err)
	return nil
}

func (p *Proc) Kind() string { return "process" }

// Endpoints returns the client URL of the process; it does not change over
// restarts.
func (p *Proc) Endpoints() []string { return []string{"http://" + p.clientAddr} }

// args are etcd's flags for this member: a single member, on the same data
// directory and ports at every start.
func (p *Proc) args() []string {
	curl, purl := "http://"+p.clientAddr, "http://"+p.peerAddr
	return []string{
		"--name", "lanes-test",
		"--data-dir", p.dir,
		"--listen-client-urls", curl,
		"--advertise-client-urls", curl,
		"--listen-peer-urls", purl,
		"--initial-advertise-peer-urls", purl,
		"--initial-cluster", "lanes-test=" + purl,
		"--initial-cluster-state", "new",
		"--logger", "zap",
		"--log-outputs", "stderr",
		"--log-level", "warn",
		"--bcrypt-cost", fmt.Sprint(bcryptCost),
		// A fast election makes starts and restarts take a fraction of a
		// second instead of two; a single member has no peers to miss.
		"--heartbeat-interval", "10",
		"--election-timeout", "100",
	}
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

// waitHealthy polls the member's /health with hc until it says true (the
// member serves and its cluster has a leader), and checks that the process
// pid is the one listening on clientAddr: if another process took the port
// first, it answers the health check while the member fails to bind, and
// the member's start is an error once it has exited (its log then says
// "address already in use", and the caller picks other ports).
func waitHealthy(ctx context.Context, hc *http.Client, pid int, clientAddr, curl string, exited <-chan struct{}) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, curl+"/health", nil)
		if resp, err := hc.Do(req); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && bytes.Contains(body, []byte(`"true"`)) {
				return proctest.WaitOwner(ctx, pid, clientAddr, exited)
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
