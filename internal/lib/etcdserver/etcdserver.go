// Package etcdserver runs a single-member etcd inside the lanes process.
//
// It is what `lanes up` uses to give a laptop or a small deployment a registry
// and policy store without installing etcd, and what the tests use to get a
// real etcd in-process. The member listens on loopback only unless told
// otherwise, logs only errors, and keeps its data in Config.Dir, so that a
// later Start on the same directory (with the same addresses) finds the same
// keys, leases and revisions.
//
// For a fleet, run an etcd cluster and point lanes at it (see docs/etcd.md);
// this package is not a clustering tool.
package etcdserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/fileutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// DefaultName is the member name used when Config.Name is empty.
const DefaultName = "lanes"

// Config configures Start. Only Dir is required.
type Config struct {
	// Name is the member name (DefaultName when empty). Keep it stable for a
	// given Dir: etcd records it in the data directory.
	Name string
	// Dir is the data directory. It is created if missing. Start on an
	// existing directory restarts the member with its data.
	Dir string
	// ClientAddr is the host:port that clients connect to, for example
	// "127.0.0.1:2379". When empty, or when the port is 0, a free port on
	// the host (127.0.0.1 by default) is chosen.
	ClientAddr string
	// PeerAddr is the host:port of the (unused, single-member) peer
	// listener. Chosen like ClientAddr when empty or port 0.
	PeerAddr string
	// Logger receives etcd's own log entries (slog.Default() when nil).
	Logger *slog.Logger
	// LogLevel is the least level of etcd's entries that reach Logger:
	// "debug", "info", "warn" or "error" (the default). etcd is chatty
	// below "warn".
	LogLevel string
	// UnsafeNoFsync disables fsync in etcd. It makes tests faster and must
	// not be used for data anyone cares about.
	UnsafeNoFsync bool
	// BcryptCost is the cost of the bcrypt hashes of the passwords etcd
	// keeps and checks when authentication is on (etcd's default, 10, when
	// zero; 4 to 31). Tests lower it: a hash at 10 takes seconds in a test
	// binary built with the race detector.
	BcryptCost int
	// RootPassword, when set, turns etcd's authentication on: Start
	// creates the root user with this password (or, when authentication
	// is already on, checks that it is the root user's) and enables
	// authentication, so that only a client with credentials reads or
	// writes. With NoAuth, it is the password that turns authentication
	// off again.
	RootPassword string
	// NoAuth leaves authentication off, turning it off (with
	// RootPassword) when an earlier start turned it on.
	NoAuth bool
}

// RootUser is the etcd user that RootPassword is the password of.
const RootUser = "root"

// ErrRootPassword is a Start with authentication on in the data directory
// and another RootPassword than the root user's.
var ErrRootPassword = errors.New("etcdserver: authentication is on, and the root password given is not etcd's")

// Server is a running embedded etcd member.
type Server struct {
	etcd      *embed.Etcd
	quiet     *atomic.Bool // set by Close to drop etcd's shutdown noise
	endpoints []string
	peers     []string
	closeOnce sync.Once
}

// Start starts an embedded etcd member and waits until it serves clients or
// ctx is done. When a port is chosen automatically and another process takes
// it before etcd binds it, Start tries again with new ports a few times.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("etcdserver: Config.Dir is required")
	}
	if c := cfg.BcryptCost; c != 0 && (c < 4 || c > 31) {
		return nil, fmt.Errorf("etcdserver: Config.BcryptCost %d: want 4 to 31, or 0 for etcd's default", c)
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "error"
	}
	var level zapcore.Level
	if err := level.Set(cfg.LogLevel); err != nil {
		return nil, fmt.Errorf("etcdserver: LogLevel: %w", err)
	}
	const attempts = 5
	var lastErr error
	waits := 0 // for a WAL's lock, 100 ms each
	for tries := 0; tries < attempts; {
		clientURL, clientAuto, err := loopbackURL(cfg.ClientAddr)
		if err != nil {
			return nil, fmt.Errorf("etcdserver: client address: %w", err)
		}
		peerURL, peerAuto, err := loopbackURL(cfg.PeerAddr)
		if err != nil {
			return nil, fmt.Errorf("etcdserver: peer address: %w", err)
		}
		s, err := start(ctx, cfg, level, clientURL, peerURL)
		if err == nil {
			return s, nil
		}
		lastErr = err
		if locked(err) && ctx.Err() == nil && waits < 50 {
			// The member that had this directory a moment ago, in this
			// process, may still hold its WAL's lock while it closes; a
			// process that holds it is refused after 5 s.
			waits++
			t := time.NewTimer(100 * time.Millisecond)
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
				t.Stop()
			}
		}
		tries++
		if !(clientAuto || peerAuto) || !errors.Is(err, syscall.EADDRINUSE) || ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

// locked reports whether err is etcd's refusal of a data directory whose
// WAL another member holds (fileutil.ErrLocked, which etcd reports as text).
func locked(err error) bool {
	return errors.Is(err, fileutil.ErrLocked) || strings.Contains(err.Error(), fileutil.ErrLocked.Error())
}

func start(ctx context.Context, c Config, level zapcore.Level, clientURL, peerURL *url.URL) (*Server, error) {
	quiet := new(atomic.Bool)
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.Dir
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(newZapLogger(c.Logger, level, quiet))
	cfg.UnsafeNoFsync = c.UnsafeNoFsync
	if c.BcryptCost != 0 {
		cfg.BcryptCost = uint(c.BcryptCost)
	}
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.InitialClusterToken = "lanes-" + cfg.Name

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcdserver: start: %w", err)
	}
	fail := func(err error) (*Server, error) {
		quiet.Store(true)
		e.Close()
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return fail(fmt.Errorf("etcdserver: start: %w", err))
	case <-e.Server.StopNotify():
		return fail(errors.New("etcdserver: stopped while starting"))
	case <-ctx.Done():
		return fail(fmt.Errorf("etcdserver: waiting for etcd to be ready: %w", ctx.Err()))
	}
	s := &Server{etcd: e, quiet: quiet}
	for _, l := range e.Clients {
		s.endpoints = append(s.endpoints, "http://"+l.Addr().String())
	}
	for _, p := range e.Peers {
		s.peers = append(s.peers, "http://"+p.Addr().String())
	}
	if err := s.setAuth(ctx, c); err != nil {
		return fail(err)
	}
	return s, nil
}

// setAuth turns authentication on or off as c asks.
func (s *Server) setAuth(ctx context.Context, c Config) error {
	on := s.etcd.Server.AuthStore().IsAuthEnabled()
	switch {
	case !c.NoAuth && c.RootPassword == "": // the caller leaves it as it is
		return nil
	case !c.NoAuth && on:
		return s.checkRoot(c.RootPassword)
	case c.NoAuth && !on:
		return nil
	case c.NoAuth && c.RootPassword == "":
		return errors.New("etcdserver: authentication is on: turning it off takes the root password")
	}
	// Turn it on (it is off), or off (it is on).
	user := ""
	if on {
		user = RootUser
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.endpoints, Username: user, Password: c.RootPassword,
		DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("etcdserver: authentication: %w", err)
	}
	defer cli.Close()
	if c.NoAuth {
		if _, err := cli.AuthDisable(ctx); err != nil {
			return fmt.Errorf("etcdserver: turning authentication off: %w", err)
		}
		return nil
	}
	steps := []func() error{
		func() error { _, err := cli.RoleAdd(ctx, "root"); return ignore(err, rpctypes.ErrRoleAlreadyExist) },
		func() error {
			_, err := cli.UserAdd(ctx, RootUser, c.RootPassword)
			if errors.Is(err, rpctypes.ErrUserAlreadyExist) {
				_, err = cli.UserChangePassword(ctx, RootUser, c.RootPassword)
			}
			return err
		},
		func() error { _, err := cli.UserGrantRole(ctx, RootUser, "root"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return fmt.Errorf("etcdserver: turning authentication on: %w", err)
		}
	}
	return nil
}

// checkRoot checks that password is the root user's.
func (s *Server) checkRoot(password string) error {
	if _, err := s.etcd.Server.AuthStore().CheckPassword(RootUser, password); err != nil {
		return fmt.Errorf("%w: %w", ErrRootPassword, err)
	}
	return nil
}

func ignore(err, want error) error {
	if errors.Is(err, want) {
		return nil
	}
	return err
}

// loopbackURL turns host:port into an http URL, choosing a free port when
// the port is 0 or addr is empty. auto reports whether it chose one.
func loopbackURL(addr string) (u *url.URL, auto bool, err error) {
	host, port := "127.0.0.1", "0"
	if addr != "" {
		if strings.Contains(addr, "://") {
			return nil, false, fmt.Errorf("%q: want host:port, not a URL", addr)
		}
		h, p, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, false, fmt.Errorf("%q: %w", addr, err)
		}
		if h != "" {
			host = h
		}
		port = p
	}
	if port == "0" {
		// embed needs concrete URLs (they are recorded in the member's
		// attributes), so ask the kernel for a free port and release it.
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, false, err
		}
		_, port, _ = net.SplitHostPort(l.Addr().String())
		l.Close()
		auto = true
	}
	return &url.URL{Scheme: "http", Host: net.JoinHostPort(host, port)}, auto, nil
}

// Endpoints returns the client URLs of the member, for clientv3.Config.
func (s *Server) Endpoints() []string { return append([]string(nil), s.endpoints...) }

// PeerEndpoints returns the peer URLs that the member listens on.
func (s *Server) PeerEndpoints() []string { return append([]string(nil), s.peers...) }

// Err reports a fatal error of the running member (for example a listener
// that failed). etcd closes it when the member has stopped.
func (s *Server) Err() <-chan error { return s.etcd.Err() }

// Close stops the member and waits until it has stopped and released its
// listeners and data directory. It is safe to call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.quiet.Store(true)
		s.etcd.Close()
	})
	return nil
}
