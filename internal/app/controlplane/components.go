package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/app/admin"
	"github.com/lanesdev/lanes/internal/app/dashboard"
	"github.com/lanesdev/lanes/internal/lib/accept"
	"github.com/lanesdev/lanes/internal/lib/etcdserver"
	"github.com/lanesdev/lanes/routing"
)

// fatalWatch forwards the fatal error of an embedded server to the runtime,
// which then shuts lanes up down, until it is stopped.
type fatalWatch struct {
	quit chan struct{}
	done chan struct{}
}

func (w *fatalWatch) start(rt *Runtime, what string, errs <-chan error) {
	w.quit, w.done = make(chan struct{}), make(chan struct{})
	go func() { // owned by w: stop waits for it
		defer close(w.done)
		select {
		case err, ok := <-errs:
			if ok && err != nil {
				rt.Fail(fmt.Errorf("%s: %w", what, err))
			}
		case <-w.quit:
		}
	}()
}

func (w *fatalWatch) stop() {
	if w.quit != nil {
		close(w.quit)
		<-w.done
		w.quit = nil
	}
}

// etcdComponent runs the embedded etcd, or connects to an external cluster,
// and provides the Store.
type etcdComponent struct {
	srv   *etcdserver.Server
	store *etcdstore.Store
	rt    *Runtime
	fatal fatalWatch
}

func (*etcdComponent) Name() string    { return "etcd" }
func (*etcdComponent) Needs() []Dep    { return []Dep{DataDirKey} }
func (*etcdComponent) Provides() []Dep { return []Dep{StoreKey, EtcdKey} }

func (*etcdComponent) Validate(cfg *Config) error { return cfg.validateEtcd() }

func (c *etcdComponent) Provision(ctx context.Context, rt *Runtime) error {
	c.rt = rt
	cfg := rt.Config.Etcd
	sc := etcdstore.Config{DialTimeout: cfg.DialTimeout, Options: etcdstore.Options{Prefix: cfg.Prefix, Logger: rt.Log}}
	note := ""
	embedded := len(cfg.Endpoints) == 0
	info := EtcdInfo{Embedded: embedded}
	if embedded {
		dir := filepath.Join(Need(rt, DataDirKey), "etcd")
		pwFile := filepath.Join(Need(rt, DataDirKey), EtcdPasswordFile)
		password, created, err := secretFile(pwFile, "etcd password", admin.NewSecret, 16)
		if err != nil {
			return err
		}
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		srv, err := etcdserver.Start(sctx, etcdserver.Config{
			Dir:          dir,
			ClientAddr:   cfg.ClientAddr,
			PeerAddr:     cfg.PeerAddr,
			Logger:       rt.Log.With("component", "etcd"),
			RootPassword: password,
			NoAuth:       cfg.NoAuth,
			BcryptCost:   etcdBcryptCost,
		})
		cancel()
		if err != nil && created {
			// Not (yet) the password of this data: keep none, so that
			// the next start says the same.
			os.Remove(pwFile)
		}
		if errors.Is(err, etcdserver.ErrRootPassword) {
			if created {
				return fmt.Errorf("embedded etcd in %s: its authentication is on, and %s, which holds its root password, is missing: restore it from a backup of the data directory", dir, pwFile)
			}
			return fmt.Errorf("embedded etcd in %s: its authentication is on, and %s does not hold its root password: restore the file from a backup of the data directory", dir, pwFile)
		}
		if err != nil {
			return fmt.Errorf("embedded etcd in %s: %w", dir, err)
		}
		c.srv = srv
		sc.Endpoints = srv.Endpoints()
		note = "embedded, data in " + dir
		if cfg.NoAuth {
			note += "; authentication off (etcd.no_auth)"
		} else {
			sc.Username, sc.Password = etcdserver.RootUser, password
			info.Username, info.PasswordFile = etcdserver.RootUser, pwFile
			note += "; user root, password in " + pwFile
		}
	} else {
		sc.Endpoints = cfg.Endpoints
		sc.Username, sc.Password = cfg.Username, cfg.Password
		if cfg.CA != "" || cfg.Cert != "" {
			tlsCfg, err := etcdTLS(cfg)
			if err != nil {
				return err
			}
			sc.TLS = tlsCfg
		}
		note = "external"
		if len(cfg.Endpoints) > 1 {
			note = fmt.Sprintf("external, %d endpoints", len(cfg.Endpoints))
		}
	}
	// No instance address may reach etcd: the embedded member's client and
	// peer listeners, or the external cluster's endpoints.
	name := "etcd"
	if c.srv != nil {
		name = "etcd client"
		for _, p := range c.srv.PeerEndpoints() {
			if err := rt.Listening(ctx, "etcd peer", p); err != nil {
				return err
			}
		}
	}
	for _, ep := range sc.Endpoints {
		if !strings.Contains(ep, "://") {
			ep = "http://" + ep
		}
		if err := rt.Listening(ctx, name, ep); err != nil {
			if embedded {
				return err
			}
			// An external endpoint that does not resolve now: etcdstore
			// reports it if it matters; every instance dial is checked
			// against what the others reach.
			rt.Log.Warn("an etcd endpoint could not be resolved to reserve it from instance addresses", "endpoint", ep, "err", err)
		}
	}
	st, err := etcdstore.Open(ctx, sc)
	if err != nil {
		return err
	}
	c.store = st
	Provide(rt, StoreKey, st)
	info.Endpoints = sc.Endpoints
	Provide(rt, EtcdKey, info)
	rt.Announce(Address{Name: "etcd", URL: strings.Join(sc.Endpoints, ","), Note: note + "; prefix " + st.Prefix()})
	return nil
}

func etcdTLS(cfg EtcdConfig) (*tls.Config, error) {
	return etcdstore.TLSFiles(cfg.CA, cfg.Cert, cfg.Key)
}

// Start watches the embedded member for a fatal error.
func (c *etcdComponent) Start(context.Context) error {
	if c.srv == nil {
		return nil
	}
	c.fatal.start(c.rt, "embedded etcd", c.srv.Err())
	return nil
}

func (c *etcdComponent) Stop(context.Context) error {
	c.fatal.stop()
	return nil
}

func (c *etcdComponent) Cleanup() error {
	var errs []error
	if c.store != nil {
		errs = append(errs, c.store.Close())
	}
	if c.srv != nil {
		errs = append(errs, c.srv.Close())
	}
	return errors.Join(errs...)
}

// engineComponent is the control plane's routing engine: the gateway routes
// with it, and the admin API reads the policy in force from it.
type engineComponent struct {
	engine *routing.Engine
}

func (*engineComponent) Name() string    { return "engine" }
func (*engineComponent) Needs() []Dep    { return []Dep{StoreKey, RegistryKey} }
func (*engineComponent) Provides() []Dep { return []Dep{EngineKey} }

func (c *engineComponent) Provision(ctx context.Context, rt *Runtime) error {
	st := Need(rt, StoreKey)
	c.engine = routing.New(routing.WithRegistry(Need(rt, RegistryKey)), routing.WithRegistryLanes(), routing.WithPolicyStore(st.Policy()), routing.WithLogger(rt.Log))
	Provide(rt, EngineKey, c.engine)
	select {
	case <-c.engine.PolicyReady():
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(30 * time.Second):
		return errors.New("the policy could not be read from etcd within 30s")
	}
	return nil
}

func (c *engineComponent) Cleanup() error {
	if c.engine != nil {
		return c.engine.Close()
	}
	return nil
}

// claimsComponent follows the client-IP claims of dev sessions, for the
// gateway.
type claimsComponent struct {
	t *admin.ClaimTable
}

func (*claimsComponent) Name() string    { return "claims" }
func (*claimsComponent) Needs() []Dep    { return []Dep{StoreKey} }
func (*claimsComponent) Provides() []Dep { return []Dep{ClaimsKey} }

func (c *claimsComponent) Provision(ctx context.Context, rt *Runtime) error {
	st := Need(rt, StoreKey)
	c.t = admin.WatchClaims(st, rt.Log)
	Provide(rt, ClaimsKey, c.t)
	select {
	case <-c.t.Ready():
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(30 * time.Second):
		return errors.New("the claims could not be read from etcd within 30s")
	}
	return nil
}

func (c *claimsComponent) Cleanup() error {
	if c.t != nil {
		return c.t.Close()
	}
	return nil
}

// adminComponent serves the admin API.
type adminComponent struct {
	rt   *Runtime
	api  *admin.Server
	dash *dashboard.Server
	srv  *http.Server
	ln   net.Listener
	tls  *tls.Config // nil: plain HTTP
	done chan struct{}
}

func (*adminComponent) Name() string { return "admin" }
func (*adminComponent) Needs() []Dep {
	return []Dep{DataDirKey, StoreKey, RegistryKey, EtcdKey, EngineKey, ClaimsKey, GatewayKey, TracesKey, XDSKey, NatsKey}
}
func (*adminComponent) Provides() []Dep { return []Dep{AdminKey} }

// AdminTokenFile is the file, in the data directory, of the admin token.
const AdminTokenFile = "admin-token"

func (*adminComponent) Validate(cfg *Config) error {
	if err := checkListen(cfg.AdminAddr); err != nil {
		return cfg.fail("admin_addr", cfg.AdminAddr, "%v", err)
	}
	if cfg.AdminToken != "" && len(cfg.AdminToken) < 16 {
		return cfg.fail("admin_token", "(hidden)", "the admin token must be at least 16 characters")
	}
	if h := cfg.TunnelHost; h != "" {
		if _, err := netip.ParseAddr(h); err != nil {
			return cfg.fail("tunnel_host", h, "want an IP address, such as 10.0.0.5 (the relays listen on a port of their own choosing)")
		}
	}
	_, err := cfg.ParsedLaneClaims()
	return err
}

func (c *adminComponent) Provision(ctx context.Context, rt *Runtime) error {
	c.rt = rt
	token, note, err := adminToken(rt.Config, Need(rt, DataDirKey))
	if err != nil {
		return err
	}
	st, etcd, gw := Need(rt, StoreKey), Need(rt, EtcdKey), Need(rt, GatewayKey)
	gc, err := rt.Config.GatewayConfig()
	if err != nil {
		return err
	}
	routes := gc.Routes
	if routes == nil {
		routes = []adminapi.Route{}
	}
	info := adminapi.Info{
		Etcd:  adminapi.EtcdInfo{Endpoints: etcd.Endpoints, Embedded: etcd.Embedded, Prefix: st.Prefix()},
		Admin: adminapi.AdminInfo{},
		Gateway: adminapi.GatewayInfo{URL: gw.URL, Domain: rt.Config.Domain, Routes: routes,
			TrustedProxies: rt.Config.TrustedProxies, Zone: rt.Config.Zone},
	}
	tc, err := rt.Config.ServerTLS(tlsAdmin)
	if err != nil {
		return err
	}
	ln, err := rt.Listen("admin", rt.Config.AdminAddr)
	if err != nil {
		return err
	}
	url := listenerURL(ln.Addr(), tc)
	c.ln, c.tls = ln, tc
	info.Admin.URL = url
	claimNets, err := rt.Config.ParsedLaneClaims()
	if err != nil {
		return err
	}
	api, err := admin.New(admin.Config{Store: st, Engine: Need(rt, EngineKey), Registry: Need(rt, RegistryKey), AdminToken: token, Info: info,
		Claims: Need(rt, ClaimsKey), Traces: Need(rt, TracesKey).Collector, Logger: rt.Log, Gatherer: gatherers(rt),
		ClaimNets: claimNets, XDS: Need(rt, XDSKey).Callers,
		Reserved: rt.Reserved(), AllowLinkLocal: rt.Config.AllowLinkLocal,
		TunnelHost: rt.Config.TunnelHost, TunnelNATS: natsHostPort(Need(rt, NatsKey).URL),
		ForkNamespaces: forkNamespaces(rt.Config), ForkLimits: admin.ForkLimits{PerLane: rt.Config.Kube.MaxForks, Replicas: rt.Config.Kube.MaxReplicas},
		ForkImages: rt.Config.Kube.ForkImages})
	if err != nil {
		return err
	}
	c.api = api
	trusted, err := rt.Config.ParsedTrustedProxies()
	if err != nil {
		return err
	}
	dash, err := dashboard.New(dashboard.Config{API: api, Logger: rt.Log, TrustedProxies: trusted})
	if err != nil {
		return err
	}
	c.dash = dash
	c.srv = &http.Server{Handler: dashboard.Mount(api, dash), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(rt.Log.Handler(), slog.LevelWarn)}
	c.srv.RegisterOnShutdown(func() { api.Close(); dash.Close() })
	Provide(rt, AdminKey, AdminInfo{URL: url, Token: token, API: api})
	rt.Announce(Address{Name: "admin", URL: url, Note: note})
	rt.Announce(Address{Name: "dashboard", URL: url + dashboard.Prefix, Note: "log in with the admin token or a lane token"})
	return nil
}

// forkNamespaces are the namespaces where the admin API takes forks: none
// without the Kubernetes controllers.
func forkNamespaces(cfg Config) []string {
	if !cfg.Kube.Enabled {
		return nil
	}
	return cfg.KubeNamespaces()
}

// AdminMaxConns caps the connections open at once on the admin API (and
// the dashboard, on the same listener): a sixteenth of the process's
// open-file limit, at most 1,000. A connection over it is answered 503 and
// closed.
func AdminMaxConns() int { return accept.Share(16, 1000) }

var adminShed = accept.Answer("", "lanes: the admin API is at its connection limit; try again\n")

func (c *adminComponent) Start(context.Context) error {
	c.done = make(chan struct{})
	// The accept loop waits out a temporary accept error (net/http's
	// would too, not ENOBUFS) and caps the connections.
	var ln net.Listener = accept.Wrap(c.ln, accept.Options{Name: "admin API", MaxConns: AdminMaxConns(), Logger: c.rt.Log,
		Shed: func(conn net.Conn) { conn.Write(adminShed) }})
	if c.tls != nil {
		// Over the accept loop, so that net/http sees a *tls.Conn: it
		// negotiates HTTP/2 by ALPN and tells the handlers the TLS state.
		ln = tls.NewListener(ln, c.tls)
	}
	go func() {
		defer close(c.done)
		if err := c.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			c.rt.Fail(fmt.Errorf("admin API: %w", err))
		}
	}()
	c.ln = nil // the server owns it now
	return nil
}

func (c *adminComponent) Stop(ctx context.Context) error {
	c.api.Close()
	c.dash.Close()
	err := c.srv.Shutdown(ctx)
	if err != nil {
		c.srv.Close()
	}
	<-c.done
	return err
}

func (c *adminComponent) Cleanup() error {
	if c.ln != nil { // provisioned but never started
		c.ln.Close()
	}
	if c.api != nil {
		c.api.Close()
	}
	if c.dash != nil {
		c.dash.Close()
	}
	return nil
}

// EtcdPasswordFile is the file, in the data directory, of the embedded
// etcd's root password.
const EtcdPasswordFile = "etcd-password"

// etcdBcryptCost is the bcrypt cost of the embedded etcd's password hash:
// the lowest. A slow hash guards a guessable password; the root password is
// 32 random bytes, and the etcd client logs in again (one hash checked by
// the server) on every stream it opens, each watch and lease keep-alive,
// which at etcd's default cost (10) takes tens of milliseconds of CPU each.
const etcdBcryptCost = 4

// adminToken returns the admin token: from the configuration, else from
// <dir>/admin-token, else a new one written there (mode 0600).
func adminToken(cfg Config, dir string) (token, note string, err error) {
	return secretToken(cfg.AdminToken, cfg.sources["admin_token"], filepath.Join(dir, AdminTokenFile), admin.NewAdminToken, "admin token")
}

// secretToken returns a credential (what names it): value, set from src,
// else the one in the file at path, else a new one from fresh written there (mode 0600); and a
// note that says where it came from.
func secretToken(value, src, path string, fresh func() string, what string) (token, note string, err error) {
	if value != "" {
		if src == "" {
			src = "the configuration"
		}
		return value, what + " from " + src, nil
	}
	t, created, err := secretFile(path, what, fresh, 16)
	if err != nil {
		return "", "", err
	}
	if created {
		return t, what + " created in " + path, nil
	}
	return t, what + " in " + path, nil
}

// secretFile returns the secret kept in path, or a new one from gen that
// it writes there (mode 0600, created: true); what names it in errors. A
// secret shorter than minLen is refused.
func secretFile(path, what string, gen func() string, minLen int) (secret string, created bool, err error) {
	data, err := os.ReadFile(path)
	if err == nil {
		t := strings.TrimSpace(string(data))
		if len(t) < minLen {
			return "", false, fmt.Errorf("%s: the %s must be at least %d characters; delete the file to get a new one", path, what, minLen)
		}
		return t, false, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", false, fmt.Errorf("%s: %w", what, err)
	}
	t := gen()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", false, fmt.Errorf("%s: %w", what, err)
	}
	if _, err := f.WriteString(t + "\n"); err != nil {
		f.Close()
		return "", false, fmt.Errorf("%s: %w", what, err)
	}
	if err := f.Close(); err != nil {
		return "", false, fmt.Errorf("%s: %w", what, err)
	}
	return t, true, nil
}

// gatherers is what /metrics serves: the control plane's registry (the
// admin API's and the gateway's metrics) and the default one (the Go
// runtime, the process and the embedded etcd).
func gatherers(rt *Runtime) prometheus.Gatherer {
	return prometheus.Gatherers{rt.Metrics, prometheus.DefaultGatherer}
}

// natsHostPort is the host:port of the first server of a NATS URL list, for
// the tunnels' NATS forward; "" when there is none.
func natsHostPort(urls string) string {
	first, _, _ := strings.Cut(urls, ",")
	u, err := natsURL(strings.TrimSpace(first))
	if err != nil || first == "" {
		return ""
	}
	return u.Host
}
