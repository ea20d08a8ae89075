// Package amqptest runs a RabbitMQ broker for tests: Debian's
// rabbitmq-server as a child process on free loopback ports, with its own
// node name, data, logs, Erlang distribution port and epmd port in a
// temporary directory, and no plugins (no management listener). Tests skip
// with SkipMessage when rabbitmq-server is not installed.
package amqptest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/lanesdev/lanes/internal/testkit/proctest"
)

// BinEnv names the variable that may point at the rabbitmq-server script.
const BinEnv = "LANES_RABBITMQ_SERVER"

// SkipMessage is why the tests skip when there is no broker to run.
const SkipMessage = "rabbitmq-server not found (on PATH, /usr/sbin or /usr/lib/rabbitmq/bin, or " + BinEnv + "): `apt-get install rabbitmq-server` to run the RabbitMQ tests"

// Bin returns the path of rabbitmq-server, or "": Debian's own script
// first, as /usr/sbin/rabbitmq-server (first on PATH) runs it as the
// rabbitmq user, who cannot write the test's directory.
func Bin() string {
	if os.Getenv(BinEnv) == "" {
		if fi, err := os.Stat(debianBin); err == nil && !fi.IsDir() {
			return debianBin
		}
	}
	return proctest.Find(BinEnv, "rabbitmq-server")
}

const debianBin = "/usr/lib/rabbitmq/bin/rabbitmq-server"

var nodeSeq atomic.Int64

// Broker is a rabbitmq-server process.
type Broker struct {
	*proctest.Proc
	addr     string
	epmdPort int
}

// URL is the broker's AMQP URL, amqp://guest:guest@127.0.0.1:port/; it
// does not change over restarts.
func (b *Broker) URL() string { return "amqp://guest:guest@" + b.addr + "/" }

// Addr is the broker's host:port.
func (b *Broker) Addr() string { return b.addr }

// Start runs a broker, or skips the test when there is none to run. It is
// killed at the test's cleanup, with its epmd.
func Start(t testing.TB) *Broker {
	t.Helper()
	bin := Bin()
	if bin == "" {
		t.Skip(SkipMessage)
	}
	// The ports are chosen free, then handed to the broker: another process
	// (a test package running beside this one) may take one meanwhile, and
	// the broker stops at once ("eaddrinuse"). Then other ports are tried.
	for attempt := 1; ; attempt++ {
		b, err := start(t, bin)
		if err == nil {
			return b
		}
		if attempt == 4 || !b.LogContains("eaddrinuse") {
			t.Fatal(err)
		}
		t.Logf("rabbitmq-server: a port was taken before it bound; trying others (%v)", err)
	}
}

func start(t testing.TB, bin string) (*Broker, error) {
	dir := t.TempDir()
	ports := make([]int, 3)
	for i := range ports {
		a, err := proctest.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		_, p, _ := net.SplitHostPort(a)
		ports[i], _ = strconv.Atoi(p)
	}
	b := &Broker{addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), epmdPort: ports[2]}
	conf := filepath.Join(dir, "rabbitmq.conf")
	plugins := filepath.Join(dir, "enabled_plugins")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("listeners.tcp.default = %s\nloopback_users = none\n", b.addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(plugins, []byte("[].\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	node := fmt.Sprintf("lanes-test-%d-%d@localhost", os.Getpid(), nodeSeq.Add(1))
	env := []string{
		"PATH=" + os.Getenv("PATH") + ":/usr/sbin:/usr/bin:/bin",
		"HOME=" + dir, // the Erlang cookie
		"RABBITMQ_NODENAME=" + node,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT=" + strconv.Itoa(ports[0]),
		"RABBITMQ_DIST_PORT=" + strconv.Itoa(ports[1]),
		"ERL_EPMD_PORT=" + strconv.Itoa(ports[2]),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(dir, "log"),
		"RABBITMQ_LOGS=-",
		"RABBITMQ_CONFIG_FILE=" + conf,
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + plugins,
		"RABBITMQ_PLUGINS_EXPAND_DIR=" + filepath.Join(dir, "plugins"),
		// A VM that fails to start writes its crash dump here, not into
		// the test's working directory (the package's source folder).
		"ERL_CRASH_DUMP=" + filepath.Join(dir, "erl_crash.dump"),
		// The script then execs the Erlang VM instead of running it in the
		// background: the process is the broker, and SIGKILL kills it.
		"RUNNING_UNDER_SYSTEMD=true",
	}
	b.Proc = proctest.New(t, proctest.Spec{
		Name: "rabbitmq-server", Bin: bin, LogPath: filepath.Join(dir, "rabbitmq.log"),
		Args: func() []string { return nil }, Env: env, Timeout: 2 * time.Minute,
		Ready: func(ctx context.Context, pid int, exited <-chan struct{}) error {
			for {
				c, err := amqp.DialConfig(b.URL(), amqp.Config{Dial: amqp.DefaultDial(time.Second)})
				if err == nil {
					c.Close()
					return proctest.WaitOwner(ctx, pid, b.addr, exited)
				}
				select {
				case <-exited:
					return fmt.Errorf("exited before serving on %s", b.addr)
				case <-ctx.Done():
					return fmt.Errorf("not serving on %s: %w (%v)", b.addr, ctx.Err(), err)
				case <-time.After(200 * time.Millisecond):
				}
			}
		},
	})
	t.Cleanup(func() {
		// The broker is killed by proctest's cleanup (registered first, so
		// run after this one): stop it here first, then its epmd.
		b.Kill()
		if epmd, err := exec.LookPath("epmd"); err == nil {
			exec.Command(epmd, "-port", strconv.Itoa(b.epmdPort), "-kill").Run()
		}
	})
	return b, b.Start()
}
