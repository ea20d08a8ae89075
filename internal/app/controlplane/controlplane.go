// Package controlplane is `lanes up`: one process that runs the lanes control
// plane with embedded defaults — an embedded etcd (or a connection to an
// external cluster), the routing engine, the admin API and the gateway.
//
// Each part is a Component with a Caddy-like lifecycle (Validate, Provision,
// Start, Stop, Cleanup). A component declares what it needs and what it
// provides, as typed keys (StoreKey, EngineKey, ...): the control plane
// orders the components by these declarations, so that later parts (a
// dashboard) slot in without touching the others. Every component's
// Validate runs before any component is provisioned, so a bad setting is
// refused before anything starts. The built-in components, in their order:
//
//	datadir → etcd → nats → registry → engine → traces → claims → gateway → xds → admin
//
// registry is what the engine routes from: etcd's instances, and with
// kube.enabled the pods of the Kubernetes namespaces lanes serves.
//
// traces is the trace collector (internal/app/collector); xds is the xDS
// server for gRPC's proxyless clients (internal/app/xds), off by default.
//
// datadir locks the data directory (<data-dir>/lanes.lock, with the pid of
// the holder), so that a second `lanes up` on it fails at once naming the
// process that holds it.
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

	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/app/admin"
	"github.com/lanesdev/lanes/internal/lib/addrpolicy"
	"github.com/lanesdev/lanes/internal/lib/logs"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// stopTimeout bounds a graceful stop.
const stopTimeout = 10 * time.Second

// The keys of what the built-in components provide.
var (
	// DataDirKey is the data directory, locked for this process
	// (component datadir).
	DataDirKey = Key[string]{"data directory"}
	// StoreKey is the registry and policy store (component etcd).
	StoreKey = Key[*etcdstore.Store]{"store"}
	// EtcdKey describes the etcd in use (component etcd).
	EtcdKey = Key[EtcdInfo]{"etcd"}
	// NatsKey describes the NATS server in use (component nats).
	NatsKey = Key[NatsInfo]{"nats"}
	// RegistryKey is the registry the control plane routes from (component
	// registry): the store, and with kube.enabled the pods of the
	// namespaces of kube.namespaces too, in one registry.Union where the
	// store decides an instance that both know.
	RegistryKey = Key[registry.Registry]{"registry"}
	// KubeRegistryKey is the Kubernetes cluster's registry alone (component
	// registry), nil without kube.enabled: the controllers mirror etcd's
	// instances into it.
	KubeRegistryKey = Key[registry.Registry]{"kube registry"}
	// EngineKey is the control plane's routing engine (component engine).
	EngineKey = Key[*routing.Engine]{"engine"}
	// ClaimsKey follows the client-IP claims (component claims).
	ClaimsKey = Key[*admin.ClaimTable]{"claims"}
	// GatewayKey describes the gateway (component gateway).
	GatewayKey = Key[GatewayInfo]{"gateway"}
	// AdminKey describes the admin API (component admin).
	AdminKey = Key[AdminInfo]{"admin"}
)

// EtcdInfo describes the etcd in use.
type EtcdInfo struct {
	Endpoints []string
	Embedded  bool
	// Username and PasswordFile are the credentials of the embedded etcd,
	// when its authentication is on: the root user, and the file in the
	// data directory that holds its password ("" otherwise).
	Username, PasswordFile string
}

// NatsInfo describes the NATS server in use: its client URL ("" with NATS
// off), and whether it runs in this process.
type NatsInfo struct {
	URL      string
	Embedded bool
}

// GatewayInfo describes the gateway.
type GatewayInfo struct {
	URL string
}

// AdminInfo describes the admin API: its URL, the admin token, and the
// API itself, which components in the process call (the Kubernetes
// controllers apply the policy through it).
type AdminInfo struct {
	URL   string
	Token string
	API   *admin.Server
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
	log      *slog.Logger
	extra    []Component
	progress io.Writer
}

// WithProgress makes start-up say on w what it does and what it waits for:
// the embedded etcd, NATS, the gateway, the admin API.
func WithProgress(w io.Writer) Option { return func(o *options) { o.progress = w } }

// WithLogger sets the logger (default: a text logger on stderr at the
// configured level).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithComponents adds components to the built-in ones; they are ordered by
// their dependencies with the others.
func WithComponents(c ...Component) Option {
	return func(o *options) { o.extra = append(o.extra, c...) }
}

// builtins returns the built-in components, in their order of precedence
// where the dependencies leave a choice.
func builtins() []Component {
	return []Component{
		&dataDirComponent{},
		&etcdComponent{},
		&natsComponent{},
		&registryComponent{},
		&engineComponent{},
		&collectorComponent{},
		&claimsComponent{},
		&gatewayComponent{},
		&xdsComponent{},
		&adminComponent{},
	}
}

// Server is a running control plane.
type Server struct {
	cfg Config
	lc  *lifecycle

	closeOnce sync.Once
	closeErr  error
}

// Start validates cfg and every component, then brings every component up.
// It returns once all serve; Close stops them.
func Start(ctx context.Context, cfg Config, opts ...Option) (*Server, error) {
	if err := cfg.validateOwn(); err != nil {
		return nil, err
	}
	o := &options{}
	for _, f := range opts {
		f(o)
	}
	if o.log == nil {
		o.log = NewLogger(io.Discard, cfg.LogLevel)
	}
	lc, err := newLifecycle(append(builtins(), o.extra...), cfg, o.log)
	if err != nil {
		return nil, err
	}
	lc.progress = o.progress
	if err := lc.up(ctx); err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, lc: lc}, nil
}

// Value returns the value of k that a component of s provided.
func Value[T any](s *Server, k Key[T]) (T, bool) {
	v, ok := s.lc.sh.vals[k.name].(T)
	return v, ok
}

// Config returns the configuration s runs with.
func (s *Server) Config() Config { return s.cfg }

// Addresses returns the addresses the control plane serves on.
func (s *Server) Addresses() []Address { return s.lc.sh.addresses }

// Listeners returns the control plane's own listeners, which no instance
// address may reach.
func (s *Server) Listeners() []addrpolicy.Listener { return s.lc.sh.listeners.List() }

// Failed delivers the error of a component that failed while running.
func (s *Server) Failed() <-chan error { return s.lc.sh.fatal }

// Close stops every component gracefully (within 10s) and releases them.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		s.closeErr = s.lc.down(ctx)
	})
	return s.closeErr
}

// PrintAddresses writes one line per address: name, URL and note.
func PrintAddresses(w io.Writer, addrs []Address) {
	for _, a := range addrs {
		fmt.Fprintf(w, "%-9s %-28s %s\n", a.Name, a.URL, a.Note)
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
	PrintServiceEnv(out, s)
	unrecord := RecordAdmin(s)
	defer unrecord()
	fmt.Fprintln(out, "lanes is up. Ctrl-C stops it.")
	log := s.lc.views[0].Log
	var runErr error
	select {
	case <-ctx.Done():
		log.Info("stopping")
	case runErr = <-s.Failed():
		log.Error("a component failed; stopping", "err", runErr)
	}
	if err := s.Close(); err != nil {
		return errors.Join(runErr, err)
	}
	log.Info("stopped")
	return runErr
}

// NewLogger returns a text logger at level (debug, info, warn, error).
func NewLogger(w io.Writer, level string) *slog.Logger { return logs.Must(w, level, logs.Text) }

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
