package natstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lanesdev/lanes/internal/lib/natsserver"
	"github.com/lanesdev/lanes/internal/testkit/proctest"
)

// Kinds of Member.
const (
	KindProcess  = "process"  // Debian's nats-server
	KindEmbedded = "embedded" // lanes' embedded server (internal/lib/natsserver) in a child process
)

// A Member is one NATS server with JetStream in a process of its own, on
// fixed loopback ports, its store in a directory of its own: a nats-server
// process, or the test binary running an embedded server (see RunChild).
// It keeps its ports and store over restarts. Besides Stop, Kill (SIGKILL),
// Start and Restart it can be paused with SIGSTOP (Pause) and resumed.
type Member struct {
	*proctest.Proc
	name        string
	kind        string
	clientAddr  string // 127.0.0.1:port
	clusterAddr string // "" outside a cluster
	dir         string
	routes      []string // the other members' route URLs
	cluster     string   // the cluster's name, "" outside a cluster
}

var _ Server = (*Member)(nil)

// Kind is KindProcess or KindEmbedded.
func (m *Member) Kind() string { return m.kind }

// Name is the server's name, unique in its cluster.
func (m *Member) Name() string { return m.name }

// URL is the member's client URL.
func (m *Member) URL() string { return "nats://" + m.clientAddr }

// args are the command-line arguments of a nats-server member.
func (m *Member) args() []string {
	if m.kind == KindEmbedded {
		return []string{"-test.run=^$"} // RunChild serves before any test runs
	}
	host, port, _ := net.SplitHostPort(m.clientAddr)
	a := []string{"--name", m.name, "-a", host, "-p", port, "-js", "-sd", m.dir}
	if m.cluster != "" {
		a = append(a, "--cluster_name", m.cluster, "--cluster", "nats://"+m.clusterAddr)
		if len(m.routes) > 0 {
			a = append(a, "--routes", strings.Join(m.routes, ","))
		}
	}
	return a
}

// env is the environment of an embedded member's child process.
func (m *Member) env() ([]string, error) {
	if m.kind != KindEmbedded {
		return nil, nil
	}
	cfg := natsserver.Config{Dir: m.dir, Addr: m.clientAddr, Name: m.name}
	if m.cluster != "" {
		cfg.Cluster = natsserver.Cluster{Name: m.cluster, Addr: m.clusterAddr, Routes: m.routes}
	}
	return childEnvOf(cfg)
}

// ready waits until the member accepts clients; a member outside a cluster
// must also answer JetStream requests.
func (m *Member) ready(ctx context.Context, pid int, exited <-chan struct{}) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		up := m.cluster == "" && jetStreamUp(m.URL())
		if m.cluster != "" {
			if nc, err := nats.Connect(m.URL(), nats.Timeout(time.Second), nats.NoReconnect()); err == nil {
				nc.Close()
				up = true
			}
		}
		if up {
			// Whoever answers must be the member: another process that
			// took its port first answers while the member fails to bind.
			return proctest.WaitOwner(ctx, pid, m.clientAddr, exited)
		}
		select {
		case <-exited:
			if m.kind == KindEmbedded {
				return errors.New("exited while starting (does the package's TestMain call natstest.RunChild?)")
			}
			return errors.New("exited while starting")
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// newMember returns a stopped member whose ports and peers are set. bin
// is the nats-server binary (unused for KindEmbedded).
func newMember(t testing.TB, m *Member, bin, dir string) (*Member, error) {
	m.dir = filepath.Join(dir, "store")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	env, err := m.env()
	if err != nil {
		return nil, err
	}
	if m.kind == KindEmbedded {
		bin = os.Args[0]
	}
	m.Proc = proctest.New(t, proctest.Spec{
		Name:    m.kind + " NATS server " + m.name,
		Bin:     bin,
		LogPath: filepath.Join(dir, "nats.log"),
		Args:    m.args,
		Env:     env,
		Ready:   m.ready,
		Timeout: StartTimeout,
	})
	return m, nil
}

// EmbeddedProcess starts lanes' embedded NATS server (internal/lib/natsserver)
// with JetStream in a child process of the test binary, so that a test can
// kill it with SIGKILL as it would a nats-server process. The package's
// TestMain must call RunChild. It is killed at cleanup.
func EmbeddedProcess(t testing.TB) *Member {
	t.Helper()
	var last error
	for range 3 { // another process may take the port picked meanwhile
		addr, err := proctest.FreeAddr()
		if err != nil {
			t.Fatalf("natstest: %v", err)
		}
		m, err := newMember(t, &Member{name: "lanes-test", kind: KindEmbedded, clientAddr: addr}, "", t.TempDir())
		if err != nil {
			t.Fatalf("natstest: %v", err)
		}
		if last = m.Start(); last == nil {
			return m
		}
	}
	t.Fatalf("natstest: %v", last)
	return nil
}

// ClusterConfig configures NewCluster.
type ClusterConfig struct {
	// Size is the number of members (default 3).
	Size int
	// Kind is KindProcess or KindEmbedded; the default is KindProcess when
	// a nats-server binary exists (Binary), KindEmbedded otherwise.
	Kind string
}

// A Cluster is a NATS cluster with clustered JetStream on loopback ports:
// three members by default, each a process of its own that a test can kill,
// stop, restart and pause. Everything is killed at cleanup.
type Cluster struct {
	Members []*Member
	kind    string
}

// NewCluster starts a cluster and waits until JetStream answers on every
// member. With members of KindEmbedded the package's TestMain must call
// RunChild.
func NewCluster(t testing.TB, cfg ClusterConfig) *Cluster {
	t.Helper()
	if cfg.Size == 0 {
		cfg.Size = 3
	}
	bin := Binary()
	if cfg.Kind == "" {
		cfg.Kind = KindEmbedded
		if bin != "" {
			cfg.Kind = KindProcess
		}
	}
	if cfg.Kind == KindProcess && bin == "" {
		t.Skip(SkipMessage)
	}
	var last error
	for range 3 { // another process may take a port picked meanwhile
		c, err := startCluster(t, cfg, bin)
		if err == nil {
			return c
		}
		last = err
		for _, m := range c.Members {
			m.Kill()
		}
	}
	t.Fatalf("natstest: cluster: %v", last)
	return nil
}

func startCluster(t testing.TB, cfg ClusterConfig, bin string) (*Cluster, error) {
	c := &Cluster{kind: cfg.Kind}
	root := t.TempDir()
	ms := make([]*Member, cfg.Size)
	for i := range ms {
		ca, err := proctest.FreeAddr()
		if err != nil {
			return c, err
		}
		ka, err := proctest.FreeAddr()
		if err != nil {
			return c, err
		}
		ms[i] = &Member{name: "n" + strconv.Itoa(i+1), kind: cfg.Kind, clientAddr: ca, clusterAddr: ka, cluster: "lanes-test"}
	}
	for i, m := range ms {
		for j, o := range ms {
			if j != i {
				m.routes = append(m.routes, "nats://"+o.clusterAddr)
			}
		}
		if _, err := newMember(t, m, bin, filepath.Join(root, m.name)); err != nil {
			return c, err
		}
		c.Members = append(c.Members, m)
	}
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.Start()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	return c, c.WaitJetStream(ctx)
}

// Kind is the kind of the members.
func (c *Cluster) Kind() string { return c.kind }

// URLs are the members' client URLs.
func (c *Cluster) URLs() []string {
	out := make([]string, len(c.Members))
	for i, m := range c.Members {
		out[i] = m.URL()
	}
	return out
}

// URL lists every member's client URL, comma-separated, as nats.Connect
// and lanes up's --nats-url take them.
func (c *Cluster) URL() string { return strings.Join(c.URLs(), ",") }

// Member returns the member named name, or nil.
func (c *Cluster) Member(name string) *Member {
	for _, m := range c.Members {
		if m.name == name {
			return m
		}
	}
	return nil
}

// WaitJetStream waits until every running member answers JetStream
// requests (the cluster has a meta leader and the member knows it) and,
// when every member runs, until the meta group places a stream on all of
// them: a stream with as many replicas as members can then be created.
func (c *Cluster) WaitJetStream(ctx context.Context) error {
	running := 0
	for _, m := range c.Members {
		if !m.Running() {
			continue
		}
		running++
		if err := waitAccountInfo(ctx, m.URL()); err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
	}
	if running == len(c.Members) && running > 1 {
		return waitPlacement(ctx, c.URL(), running)
	}
	return nil
}

// waitPlacement creates and deletes a memory stream of replicas replicas until that succeeds:
// until then, a member has not yet joined the meta group ("no suitable peers for placement").
func waitPlacement(ctx context.Context, url string, replicas int) error {
	err := untilJS(ctx, url, 5*time.Second, 100*time.Millisecond, func(actx context.Context, js jetstream.JetStream) error {
		_, err := js.CreateStream(actx, jetstream.StreamConfig{Name: "natstest_placement", Subjects: []string{"natstest.placement"},
			Storage: jetstream.MemoryStorage, Replicas: replicas})
		if err == nil {
			err = js.DeleteStream(actx, "natstest_placement")
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("JetStream does not place %d replicas: %w", replicas, err)
	}
	return nil
}

// waitAccountInfo waits until the server at url answers JetStream requests.
func waitAccountInfo(ctx context.Context, url string) error {
	err := untilJS(ctx, url, 2*time.Second, 50*time.Millisecond, func(actx context.Context, js jetstream.JetStream) error {
		_, err := js.AccountInfo(actx)
		return err
	})
	if err != nil {
		return fmt.Errorf("JetStream not available: %w", err)
	}
	return nil
}

// untilJS connects to url and calls try, each call bounded by attempt and
// the next one pause later, until try succeeds. When ctx is done first, the
// error wraps ctx's and names try's last error.
func untilJS(ctx context.Context, url string, attempt, pause time.Duration, try func(context.Context, jetstream.JetStream) error) error {
	nc, err := nats.Connect(url, nats.Timeout(time.Second), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	for {
		actx, cancel := context.WithTimeout(ctx, attempt)
		err := try(actx, js)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(pause):
		}
	}
}

// StreamLeader returns the member that leads stream, as js sees it. It asks
// again while the stream has no leader (an election), until ctx is done.
func (c *Cluster) StreamLeader(ctx context.Context, js jetstream.JetStream, stream string) (*Member, error) {
	var info *jetstream.StreamInfo
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		s, err := js.Stream(actx, stream)
		cancel()
		if err == nil {
			if info = s.CachedInfo(); info.Cluster != nil && info.Cluster.Leader != "" {
				break
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("stream %s: no leader: %w (last: %v)", stream, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return nil, fmt.Errorf("stream %s has no leader", stream)
	}
	if m := c.Member(info.Cluster.Leader); m != nil {
		return m, nil
	}
	return nil, fmt.Errorf("stream %s: leader %q is not a member", stream, info.Cluster.Leader)
}
