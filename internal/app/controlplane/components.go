package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/app/admin"
	"github.com/lanesdev/lanes/internal/app/dashboard"
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
	if embedded {
		dir := filepath.Join(Need(rt, DataDirKey), "etcd")
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		srv, err := etcdserver.Start(sctx, etcdserver.Config{
			Dir:        dir,
			ClientAddr: cfg.ClientAddr,
			PeerAddr:   cfg.PeerAddr,
			Logger:     rt.Log.With("component", "etcd"),
		})
		cancel()
		if err != nil {
			return fmt.Errorf("embedded etcd in %s: %w", dir, err)
		}
		c.srv = srv
		sc.Endpoints = srv.Endpoints()
		note = "embedded, data in " + dir
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
	st, err := etcdstore.Open(ctx, sc)
	if err != nil {
		return err
	}
	c.store = st
	Provide(rt, StoreKey, st)
	Provide(rt, EtcdKey, EtcdInfo{Endpoints: sc.Endpoints, Embedded: embedded})
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
func (*engineComponent) Needs() []Dep    { return []Dep{StoreKey} }
func (*engineComponent) Provides() []Dep { return []Dep{EngineKey} }

func (c *engineComponent) Provision(ctx context.Context, rt *Runtime) error {
	st := Need(rt, StoreKey)
	c.engine = routing.New(routing.WithRegistry(st), routing.WithPolicyStore(st.Policy()), routing.WithLogger(rt.Log))
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
	done chan struct{}
}

func (*adminComponent) Name() string { return "admin" }
func (*adminComponent) Needs() []Dep {
	return []Dep{DataDirKey, StoreKey, EtcdKey, EngineKey, ClaimsKey, GatewayKey, TracesKey}
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
	return nil
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
	ln, err := listen("admin", rt.Config.AdminAddr)
	if err != nil {
		return err
	}
	url := listenerURL(ln.Addr(), tc)
	if tc != nil {
		ln = tls.NewListener(ln, tc)
	}
	c.ln = ln
	info.Admin.URL = url
	api, err := admin.New(admin.Config{Store: st, Engine: Need(rt, EngineKey), AdminToken: token, Info: info,
		Claims: Need(rt, ClaimsKey), Traces: Need(rt, TracesKey).Collector, Logger: rt.Log, Gatherer: gatherers(rt)})
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
	Provide(rt, AdminKey, AdminInfo{URL: url, Token: token})
	rt.Announce(Address{Name: "admin", URL: url, Note: note})
	rt.Announce(Address{Name: "dashboard", URL: url + dashboard.Prefix, Note: "log in with the admin token or a lane token"})
	return nil
}

func (c *adminComponent) Start(context.Context) error {
	c.done = make(chan struct{})
	ln := c.ln
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

// adminToken returns the admin token: from the configuration, else from
// <dir>/admin-token, else a new one written there (mode 0600).
func adminToken(cfg Config, dir string) (token, note string, err error) {
	if cfg.AdminToken != "" {
		src := cfg.sources["admin_token"]
		if src == "" {
			src = "the configuration"
		}
		return cfg.AdminToken, "admin token from " + src, nil
	}
	path := filepath.Join(dir, AdminTokenFile)
	data, err := os.ReadFile(path)
	if err == nil {
		t := strings.TrimSpace(string(data))
		if len(t) < 16 {
			return "", "", fmt.Errorf("%s: the admin token must be at least 16 characters; delete the file to get a new one", path)
		}
		return t, "admin token in " + path, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", "", fmt.Errorf("admin token: %w", err)
	}
	t := admin.NewAdminToken()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", "", fmt.Errorf("admin token: %w", err)
	}
	if _, err := f.WriteString(t + "\n"); err != nil {
		f.Close()
		return "", "", fmt.Errorf("admin token: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", "", fmt.Errorf("admin token: %w", err)
	}
	return t, "admin token created in " + path, nil
}

// gatherers is what /metrics serves: the control plane's registry (the
// admin API's and the gateway's metrics) and the default one (the Go
// runtime, the process and the embedded etcd).
func gatherers(rt *Runtime) prometheus.Gatherer {
	return prometheus.Gatherers{rt.Metrics, prometheus.DefaultGatherer}
}
