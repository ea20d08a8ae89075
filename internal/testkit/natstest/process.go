package natstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/lanesdev/lanes/internal/testkit/proctest"
)

// SkipMessage is the reason tests are skipped when there is no nats-server
// binary.
const SkipMessage = "nats-server binary not found on PATH or in /usr/sbin; install Debian's nats-server (the CI script does)"

// Binary returns the path of the nats-server binary: $LANES_NATS_BINARY when
// set (set it to a path that does not exist to skip the process tests), else
// nats-server on PATH, else /usr/sbin/nats-server (where Debian's package
// installs it, often not on PATH). It returns "" when there is none.
func Binary() string {
	return proctest.Find("LANES_NATS_BINARY", "nats-server", "/usr/sbin/nats-server", "/usr/local/sbin/nats-server", "/usr/local/bin/nats-server")
}

// Proc is a nats-server process with JetStream on a loopback port, its
// store in a temporary directory.
type Proc struct {
	*proctest.Proc // Start, Stop, Kill, Restart
	bin            string
	dir            string // store directory
	portDir        string // where the server writes its ports file
	port           int    // 0 until the first start picked one
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
	p := &Proc{bin: bin, dir: filepath.Join(tmp, "store"), portDir: filepath.Join(tmp, "ports")}
	if err := os.MkdirAll(p.portDir, 0o700); err != nil {
		t.Fatal(err)
	}
	p.Proc = proctest.New(t, proctest.Spec{
		Name:    "nats-server",
		Bin:     bin,
		LogPath: filepath.Join(tmp, "nats.log"),
		Args:    p.args,
		Ready:   p.waitReady,
		Timeout: StartTimeout,
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

// args are the server's flags: JetStream on, the same store directory and
// port at every start. The first start lets the server pick a free port as
// it binds; waitReady reads it from the ports file.
func (p *Proc) args() []string {
	port := "-1"
	if p.port != 0 {
		port = strconv.Itoa(p.port)
	}
	return []string{
		"--name", "lanes-test",
		"-a", "127.0.0.1",
		"-p", port,
		"-js",
		"-sd", p.dir,
		"--ports_file_dir", p.portDir,
	}
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
	_, err = nc.Request("$JS.API.INFO", nil, time.Second) //lanes:ignore a JetStream API request of the test kit, not a message in a lane
	return err == nil
}
