package etcdtest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/lanesdev/lanes/internal/testkit/proctest"
)

// ClusterConfig says what cluster NewCluster starts. The zero value is three
// members with etcd's default timing, in plain HTTP, without auth.
type ClusterConfig struct {
	// Members is the number of members (3 when zero).
	Members int
	// HeartbeatInterval and ElectionTimeout are etcd's raft timing
	// (100ms and 1s, etcd's defaults, when zero).
	HeartbeatInterval time.Duration
	ElectionTimeout   time.Duration
	// TLS serves clients over HTTPS with certificates from a CA made for
	// the test, and requires client certificates (--client-cert-auth).
	// Cluster.TLS has the files.
	TLS bool
}

// Cluster is an etcd cluster of member processes on loopback ports, each
// with its data in a temporary directory. Members can be killed (SIGKILL),
// stopped, started again on the same data and ports, and paused (SIGSTOP).
// Everything is killed at cleanup; the log of each member is printed when
// the test failed.
type Cluster struct {
	t       testing.TB
	cfg     ClusterConfig
	Members []*Member
	// TLS holds the certificate files when ClusterConfig.TLS is set.
	TLS *TLSFiles

	hc    *http.Client // for /health
	token string       // --initial-cluster-token, new at every first start

	mu       sync.Mutex
	user     string // the client's credentials, once EnableAuth ran
	password string
	client   *clientv3.Client // the kit's own, for Status; see admin
}

// Member is one member process of a Cluster.
type Member struct {
	*proctest.Proc // Start, Stop, Kill, Restart, Pause, Resume
	Name           string
	c              *Cluster
	dir            string
	clientAddr     string
	peerAddr       string
}

// NewCluster starts a cluster and waits until it has a leader, or skips the
// test with SkipMessage when the etcd binary is absent.
func NewCluster(t testing.TB, cfg ClusterConfig) *Cluster {
	t.Helper()
	bin := Binary()
	if bin == "" {
		t.Skip(SkipMessage)
	}
	if cfg.Members == 0 {
		cfg.Members = 3
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = 100 * time.Millisecond
	}
	if cfg.ElectionTimeout == 0 {
		cfg.ElectionTimeout = time.Second
	}
	c := &Cluster{t: t, cfg: cfg, hc: &http.Client{Timeout: time.Second}} //lanes:ignore the health probe of etcd members, outside lanes
	t.Cleanup(c.hc.CloseIdleConnections)
	tmp := t.TempDir()
	if cfg.TLS {
		files, err := WriteTLS(filepath.Join(tmp, "tls"))
		if err != nil {
			t.Fatalf("etcdtest: %v", err)
		}
		c.TLS = files
		tc, err := ClientConfig(files)
		if err != nil {
			t.Fatalf("etcdtest: %v", err)
		}
		c.hc.Transport = &http.Transport{TLSClientConfig: tc}
	}
	data := tmpfsDir(t)
	if data == "" {
		data = tmp
	}
	for i := range cfg.Members {
		m := &Member{c: c, Name: fmt.Sprintf("m%d", i), dir: filepath.Join(data, fmt.Sprintf("m%d", i))}
		m.Proc = proctest.New(t, proctest.Spec{
			Name:    "etcd " + m.Name,
			Bin:     bin,
			LogPath: filepath.Join(tmp, m.Name+".log"),
			Args:    m.args,
			Env:     childEnv(),
			Ready: func(ctx context.Context, pid int, exited <-chan struct{}) error {
				return waitHealthy(ctx, c.hc, pid, m.clientAddr, m.ClientURL(), exited)
			},
			Timeout: StartTimeout,
		})
		c.Members = append(c.Members, m)
	}
	token := make([]byte, 4)
	rand.Read(token)
	var err error
	for range 5 {
		if err = c.pickPorts(); err != nil {
			break
		}
		c.token = hex.EncodeToString(token)
		if err = c.startAll(); err == nil {
			break
		}
		inUse := false
		for _, m := range c.Members {
			m.Kill()
			inUse = inUse || m.LogContains("address already in use")
		}
		if !inUse {
			break
		}
		// Another process took a port between our check and etcd's bind:
		// start afresh on other ports, with empty data directories (the
		// members that had started keep the old peer URLs in theirs, and
		// would call on them forever).
		for _, m := range c.Members {
			if err := os.RemoveAll(m.dir); err != nil {
				t.Fatalf("etcdtest: cluster: %v", err)
			}
		}
		rand.Read(token)
	}
	if err != nil {
		t.Fatalf("etcdtest: cluster: %v", err)
	}
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.client != nil {
			c.client.Close()
		}
	})
	return c
}

func (c *Cluster) pickPorts() error {
	for _, m := range c.Members {
		var err error
		if m.clientAddr, err = freePort(); err != nil {
			return err
		}
		if m.peerAddr, err = freePort(); err != nil {
			return err
		}
	}
	return nil
}

// startAll starts every stopped member at once: a member of a new cluster
// (or of one that lost its quorum) is healthy only once a majority runs.
func (c *Cluster) startAll() error {
	errs := make([]error, len(c.Members))
	var wg sync.WaitGroup
	for i, m := range c.Members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.Start()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// StartAll starts every member that is not running, at once, and waits until
// each is healthy.
func (c *Cluster) StartAll() error { return c.startAll() }

// Endpoints returns the client URLs of every member, in member order.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.Members))
	for i, m := range c.Members {
		eps[i] = m.ClientURL()
	}
	return eps
}

// ClientTLS returns the TLS configuration of a client of the cluster (nil
// without TLS).
func (c *Cluster) ClientTLS() *tls.Config {
	if c.TLS == nil {
		return nil
	}
	tc, err := ClientConfig(c.TLS)
	if err != nil {
		c.t.Fatalf("etcdtest: %v", err)
	}
	return tc
}

// Client returns a client of every member, closed at cleanup, with the
// credentials of EnableAuth when it ran.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	c.mu.Lock()
	user, pass := c.user, c.password
	c.mu.Unlock()
	cl, err := clientv3.New(clientv3.Config{
		Endpoints:   c.Endpoints(),
		DialTimeout: 5 * time.Second,
		TLS:         c.ClientTLS(),
		Username:    user,
		Password:    pass,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// EnableAuth turns etcd authentication on, as the package's EnableAuth
// does. Clients from Client use user from then on.
func (c *Cluster) EnableAuth(ctx context.Context, user, password, prefix string) error {
	if err := EnableAuth(ctx, c.Client(c.t), user, password, prefix); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.user, c.password = user, password
	if c.client != nil {
		c.client.Close()
		c.client = nil
	}
	return nil
}

// admin returns the kit's own client, for Status (as root once auth is on).
func (c *Cluster) admin() (*clientv3.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client != nil {
		return c.client, nil
	}
	user, pass := "", ""
	if c.user != "" {
		user, pass = "root", RootPassword
	}
	cl, err := clientv3.New(clientv3.Config{
		Endpoints:   c.Endpoints(),
		DialTimeout: 5 * time.Second,
		TLS:         c.ClientTLS(),
		Username:    user,
		Password:    pass,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, err
	}
	c.client = cl
	return cl, nil
}

// Leader returns the member that is the leader now, asking every running
// member that is not paused; it fails when none says it leads.
func (c *Cluster) Leader(ctx context.Context) (*Member, error) {
	cl, err := c.admin()
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, m := range c.Members {
		if !m.Running() || m.Paused() {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := cl.Status(sctx, m.ClientURL())
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.Name, err))
			continue
		}
		if st.Leader != 0 && st.Leader == st.Header.MemberId {
			return m, nil
		}
	}
	return nil, fmt.Errorf("etcdtest: no member leads: %w", errors.Join(errs...))
}

// WaitLeader waits until a member leads and returns it.
func (c *Cluster) WaitLeader(ctx context.Context) (*Member, error) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		m, err := c.Leader(ctx)
		if err == nil {
			return m, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (%v)", err, ctx.Err())
		case <-tick.C:
		}
	}
}

// Followers returns the members other than m.
func (c *Cluster) Followers(m *Member) []*Member {
	var out []*Member
	for _, o := range c.Members {
		if o != m {
			out = append(out, o)
		}
	}
	return out
}

// ClientURL returns the member's client URL; it does not change over
// restarts.
func (m *Member) ClientURL() string {
	scheme := "http"
	if m.c.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + m.clientAddr
}

// PeerURL returns the member's peer URL.
func (m *Member) PeerURL() string { return "http://" + m.peerAddr }

// args are etcd's flags for this member: the same data directory, ports
// and cluster at every start. (On a start with existing data, etcd ignores
// the initial-cluster flags and rejoins.)
func (m *Member) args() []string {
	c := m.c
	var initial []string
	for _, o := range c.Members {
		initial = append(initial, o.Name+"="+o.PeerURL())
	}
	args := []string{
		"--name", m.Name,
		"--data-dir", m.dir,
		"--listen-client-urls", m.ClientURL(),
		"--advertise-client-urls", m.ClientURL(),
		"--listen-peer-urls", m.PeerURL(),
		"--initial-advertise-peer-urls", m.PeerURL(),
		"--initial-cluster", strings.Join(initial, ","),
		"--initial-cluster-state", "new",
		"--initial-cluster-token", "lanes-etcdtest-" + c.token,
		"--logger", "zap",
		"--log-outputs", "stderr",
		"--log-level", "warn",
		"--bcrypt-cost", fmt.Sprint(bcryptCost),
		"--heartbeat-interval", fmt.Sprint(c.cfg.HeartbeatInterval.Milliseconds()),
		"--election-timeout", fmt.Sprint(c.cfg.ElectionTimeout.Milliseconds()),
	}
	if c.TLS != nil {
		args = append(args,
			"--cert-file", c.TLS.ServerCert,
			"--key-file", c.TLS.ServerKey,
			"--trusted-ca-file", c.TLS.CA,
			"--client-cert-auth")
	}
	return args
}
