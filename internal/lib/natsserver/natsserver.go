// Package natsserver runs a single NATS server with JetStream inside the
// lanes process.
//
// It is what `lanes up` uses to give a laptop or a small deployment a
// message queue without installing NATS, and what the tests use to get a real
// JetStream in-process. The server listens on loopback only unless told
// otherwise, logs only warnings and errors, and keeps its JetStream data in
// Config.Dir, so that a later Start on the same directory finds the same
// streams, consumers and messages.
//
// For a fleet, run a NATS cluster and point lanes at it (see docs/mq.md).
// Config.Cluster makes a server a cluster member; the test kit
// (internal/testkit/natstest) uses it where no nats-server binary exists.
package natsserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Config configures Start. Only Dir is required.
type Config struct {
	// Dir is the JetStream storage directory. It is created if missing.
	// Start on an existing directory finds its streams again.
	Dir string
	// Addr is the host:port that clients connect to, for example
	// "127.0.0.1:4222". When empty, or when the port is 0, the server
	// picks a free port on the host (127.0.0.1 by default) as it binds, so
	// there is no race with other processes.
	Addr string
	// Name is the server name (default "lanes"). JetStream records it in
	// the data directory's metadata; keep it stable for a given Dir.
	Name string
	// Logger receives the server's warnings and errors (slog.Default()
	// when nil). Notices go to Logger at debug level.
	Logger *slog.Logger
	// SyncAlways makes JetStream fsync every write before acknowledging
	// it, so that an acknowledged message survives a crash of the machine,
	// not only of the process. It costs throughput; see docs/mq.md.
	SyncAlways bool
	// MaxStore bounds JetStream's file storage in bytes (0: the server's
	// default, a share of the free disk space).
	MaxStore int64
	// MaxMemory bounds JetStream's memory storage in bytes (0: the
	// server's default).
	MaxMemory int64
	// Cluster, when its Name is set, makes the server a member of a NATS
	// cluster with clustered JetStream. Every member needs a distinct Name
	// (above) and the same Cluster.Name.
	Cluster Cluster
}

// Cluster configures the cluster membership of a server.
type Cluster struct {
	// Name is the cluster's name, the same on every member.
	Name string
	// Addr is the host:port the server listens on for routes from the
	// other members (port 0 picks one).
	Addr string
	// Routes are the route URLs of the other members, such as
	// nats-route://127.0.0.1:6222.
	Routes []string
}

// Server is a running embedded NATS server.
type Server struct {
	ns        *server.Server
	url       string
	addr      string
	fatal     chan error
	closeOnce sync.Once
}

// Start starts the server with JetStream on and waits until it accepts
// clients, or ctx is done.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("natsserver: Config.Dir is required")
	}
	host, port, err := splitAddr(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("natsserver: address: %w", err)
	}
	if cfg.Name == "" {
		cfg.Name = "lanes"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	opts := &server.Options{
		ServerName:         cfg.Name,
		Host:               host,
		Port:               port,
		JetStream:          true,
		StoreDir:           cfg.Dir,
		SyncAlways:         cfg.SyncAlways,
		JetStreamMaxStore:  cfg.MaxStore,
		JetStreamMaxMemory: cfg.MaxMemory,
		NoSigs:             true,
		// No cluster, gateway, leafnode, websocket or monitoring listener.
	}
	if cfg.Cluster.Name != "" {
		h, p, err := splitAddr(cfg.Cluster.Addr)
		if err != nil {
			return nil, fmt.Errorf("natsserver: cluster address: %w", err)
		}
		opts.Cluster = server.ClusterOpts{Name: cfg.Cluster.Name, Host: h, Port: p}
		for _, r := range cfg.Cluster.Routes {
			u, err := url.Parse(r)
			if err != nil {
				return nil, fmt.Errorf("natsserver: route %q: %w", r, err)
			}
			opts.Routes = append(opts.Routes, u)
		}
	}
	if cfg.SyncAlways {
		opts.SyncInterval = 2 * time.Minute // the server's default; SyncAlways overrides it per write
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsserver: %w", err)
	}
	lg := &logger{l: cfg.Logger, fatal: make(chan error, 1)}
	ns.SetLoggerV2(lg, false, false, false)
	ns.Start()
	// ReadyForConnections polls; give it slices so that ctx is honoured.
	for !ns.ReadyForConnections(100 * time.Millisecond) {
		var err error
		select {
		case err = <-lg.fatal:
			// The server logs a fatal error (a listener that cannot bind)
			// and gives up without stopping: stop it.
		case <-ctx.Done():
			err = fmt.Errorf("natsserver: waiting for NATS to accept clients: %w", ctx.Err())
		default:
			if !ns.Running() {
				err = errors.New("natsserver: the server stopped while starting")
			}
		}
		if err != nil {
			ns.Shutdown()
			ns.WaitForShutdown()
			return nil, err
		}
	}
	if !ns.JetStreamEnabled() {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("natsserver: JetStream did not start (store directory %s)", cfg.Dir)
	}
	a, ok := ns.Addr().(*net.TCPAddr)
	if !ok {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, errors.New("natsserver: the server has no client listener")
	}
	addr := net.JoinHostPort(host, strconv.Itoa(a.Port))
	return &Server{ns: ns, addr: addr, url: "nats://" + addr, fatal: lg.fatal}, nil
}

// splitAddr reads host:port, defaulting the host to 127.0.0.1 and turning
// port 0 into the server's "pick one" (-1).
func splitAddr(addr string) (string, int, error) {
	if addr == "" {
		return "127.0.0.1", server.RANDOM_PORT, nil
	}
	if strings.Contains(addr, "://") {
		return "", 0, fmt.Errorf("%q: want host:port, not a URL", addr)
	}
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("%q: %w", addr, err)
	}
	if h == "" {
		h = "127.0.0.1"
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 0 || n > 65535 {
		return "", 0, fmt.Errorf("%q: port %q is not within 0..65535", addr, p)
	}
	if n == 0 {
		n = server.RANDOM_PORT
	}
	return h, n, nil
}

// URL returns the client URL, nats://host:port, for nats.Connect.
func (s *Server) URL() string { return s.url }

// Addr returns the host:port clients connect to.
func (s *Server) Addr() string { return s.addr }

// NATS returns the underlying server, for tests that need its internals.
func (s *Server) NATS() *server.Server { return s.ns }

// Err delivers a fatal error that the running server reported (for
// example a listener that failed). The server is then unusable: close it.
func (s *Server) Err() <-chan error { return s.fatal }

// Close shuts the server down and waits until it has stopped, closed its
// listener and flushed JetStream's data. It is safe to call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
	})
	return nil
}

// logger adapts the server's log calls to slog. Fatal errors are also
// handed to Start, which stops the server: the server's own logger would exit
// the process.
type logger struct {
	l     *slog.Logger
	fatal chan error
}

func (g *logger) Noticef(format string, v ...any) { g.l.Debug(fmt.Sprintf(format, v...)) }
func (g *logger) Warnf(format string, v ...any)   { g.l.Warn(fmt.Sprintf(format, v...)) }
func (g *logger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	g.l.Error(msg)
	select {
	case g.fatal <- errors.New("natsserver: " + msg):
	default:
	}
}
func (g *logger) Errorf(format string, v ...any) { g.l.Error(fmt.Sprintf(format, v...)) }
func (g *logger) Debugf(format string, v ...any) { g.l.Debug(fmt.Sprintf(format, v...)) }
func (g *logger) Tracef(format string, v ...any) {}
