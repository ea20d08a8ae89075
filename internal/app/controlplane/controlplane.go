// Package controlplane is `lanes up`: one process that runs the lanes control
// plane with embedded defaults — an embedded etcd (or a connection to an
// external cluster), the routing engine, the admin API and the gateway.
//
// Each part is a Component with a Caddy-like lifecycle (Provision, Validate,
// Start, Stop, Cleanup), run in a fixed order and stopped in the reverse
// one, so that later parts (a dashboard, a trace collector) slot in without
// touching the others:
//
//	etcd → nats → engine → claims → gateway → admin
//
// nats is the message queue of message-queue lanes (package lanesnats): an
// embedded NATS server with JetStream, its data in <data-dir>/nats, or a
// check that an external one answers.
//
// The admin API starts last, so that once it answers everything else runs;
// it stops first, so that no registration arrives while the rest stops.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/app/admin"
	"github.com/lanesdev/lanes/internal/lib/logs"
	"github.com/lanesdev/lanes/routing"
)

// stopTimeout bounds a graceful stop.
const stopTimeout = 10 * time.Second

// Runtime is what components share: the configuration, and what earlier
// components provisioned.
type Runtime struct {
	Config Config
	Log    *slog.Logger

	// Store is the registry and policy store (etcd component).
	Store *etcdstore.Store
	// Engine is the control plane's routing engine (engine component).
	Engine *routing.Engine
	// Claims follows the client-IP claims (claims component).
	Claims *admin.ClaimTable
	// Metrics is the Prometheus registry served at the admin API's
	// /metrics, with the gateway's metrics.
	Metrics *prometheus.Registry

	// Addresses are printed at start-up, in component order.
	Addresses []Address

	// EtcdEmbedded and EtcdEndpoints describe the etcd in use.
	EtcdEmbedded  bool
	EtcdEndpoints []string
	// NatsURL is the NATS server's client URL ("" with nats off), and
	// NatsEmbedded whether it runs in this process (nats component).
	NatsURL      string
	NatsEmbedded bool
	// GatewayURL is the gateway's URL once provisioned ("" without one).
	GatewayURL string
	// AdminURL and AdminToken are the admin API's (admin component).
	AdminURL   string
	AdminToken string

	fatal chan error // a component that fails while running says so here
}

// Fail reports that a running component has failed; the server stops.
func (rt *Runtime) Fail(err error) {
	select {
	case rt.fatal <- err:
	default:
	}
}

// Address is one address the control plane serves on.
type Address struct {
	Name string // "etcd", "nats", "admin", "gateway"
	URL  string
	Note string
}

// Option configures Start.
type Option func(*options)

type options struct {
	edge  EdgeFactory
	log   *slog.Logger
	extra []Component
}

// WithEdge replaces the gateway implementation (tests).
func WithEdge(f EdgeFactory) Option { return func(o *options) { o.edge = f } }

// WithLogger sets the logger (default: a text logger on stderr at the
// configured level).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithComponents appends components after the built-in ones.
func WithComponents(c ...Component) Option {
	return func(o *options) { o.extra = append(o.extra, c...) }
}

// Server is a running control plane.
type Server struct {
	rt *Runtime
	lc *lifecycle

	closeOnce sync.Once
	closeErr  error
	done      chan struct{}
}

// Start validates cfg and brings every component up. It returns once all
// serve; Close stops them.
func Start(ctx context.Context, cfg Config, opts ...Option) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := &options{edge: defaultEdge}
	for _, f := range opts {
		f(o)
	}
	if o.log == nil {
		o.log = NewLogger(io.Discard, cfg.LogLevel)
	}
	rt := &Runtime{Config: cfg, Log: o.log, Metrics: prometheus.NewRegistry(), fatal: make(chan error, 1)}
	comps := []Component{
		&etcdComponent{},
		&natsComponent{},
		&engineComponent{},
		&claimsComponent{},
		&gatewayComponent{factory: o.edge},
		&adminComponent{},
	}
	comps = append(comps, o.extra...)
	lc := &lifecycle{comps: comps}
	if err := lc.up(ctx, rt); err != nil {
		return nil, err
	}
	return &Server{rt: rt, lc: lc, done: make(chan struct{})}, nil
}

// Runtime returns what the components share (the store, the engine, ...).
func (s *Server) Runtime() *Runtime { return s.rt }

// Addresses returns the addresses the control plane serves on.
func (s *Server) Addresses() []Address { return s.rt.Addresses }

// Failed delivers the error of a component that failed while running.
func (s *Server) Failed() <-chan error { return s.rt.fatal }

// Close stops every component gracefully (within 10s) and releases them.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		s.closeErr = s.lc.down(ctx)
		close(s.done)
	})
	return s.closeErr
}

// PrintAddresses writes one line per address: name, URL and note.
func PrintAddresses(w io.Writer, addrs []Address) {
	for _, a := range addrs {
		fmt.Fprintf(w, "%-8s %-28s %s\n", a.Name, a.URL, a.Note)
	}
}

// Run starts the control plane, prints its addresses to out, and serves
// until ctx is done or a component fails; then it stops everything.
func Run(ctx context.Context, cfg Config, out io.Writer, opts ...Option) error {
	s, err := Start(ctx, cfg, opts...)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting: not a failure
		}
		return err
	}
	PrintAddresses(out, s.Addresses())
	PrintServiceEnv(out, s.rt)
	fmt.Fprintln(out, "lanes is up. Ctrl-C stops it.")
	var runErr error
	select {
	case <-ctx.Done():
		s.rt.Log.Info("stopping")
	case runErr = <-s.Failed():
		s.rt.Log.Error("a component failed; stopping", "err", runErr)
	}
	if err := s.Close(); err != nil {
		return errors.Join(runErr, err)
	}
	s.rt.Log.Info("stopped")
	return runErr
}

// NewLogger returns a text logger at level (debug, info, warn, error).
func NewLogger(w io.Writer, level string) *slog.Logger { return logs.Must(w, level, logs.Text) }

// listen opens a TCP listener, naming the setting in errors.
func listen(what, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s (--%s-addr): %w", addr, what, err)
	}
	return ln, nil
}

// httpURL returns http://host:port for a listener, with an unspecified
// host shown as 127.0.0.1.
func httpURL(a net.Addr) string {
	host, port, _ := net.SplitHostPort(a.String())
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return "http://" + host + ":" + port
}
