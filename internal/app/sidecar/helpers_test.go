package sidecar

import (
	"context"

	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lanesdev/lanes/internal/testkit/buftest"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/lanesenv"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// patience bounds every wait for something asynchronous: generous, for a
// loaded 2-core machine under -race.
const patience = 30 * time.Second

var quiet = slog.New(slog.DiscardHandler)

// mesh is an embedded etcd that sidecars and services register in, each
// with an environment of its own (lanesenv.Open), as separate processes
// would.
type mesh struct {
	t    testing.TB
	etcd string // LANES_REGISTRY
}

func newMesh(t testing.TB) *mesh {
	t.Helper()
	srv := etcdtest.Embedded(t)
	return &mesh{t: t, etcd: strings.Replace(srv.Endpoints()[0], "http://", "etcd://", 1)}
}

// getenv sees LANES_REGISTRY and nothing else.
func (m *mesh) getenv(k string) string {
	if k == lanesenv.EnvRegistry {
		return m.etcd
	}
	return ""
}

// env opens an environment on the mesh, closed at cleanup.
func (m *mesh) env() *lanesenv.Env {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	e, err := lanesenv.Open(ctx, lanesenv.WithLogger(quiet), lanesenv.WithGetenv(m.getenv))
	if err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() { e.Close() })
	return e
}

// running is a sidecar that runs until its test ends (or stop).
type running struct {
	*Sidecar
	out    *buftest.Buffer
	cancel context.CancelFunc
	done   chan error
}

// sidecar starts a sidecar on the mesh with cfg (its Listen, Proxy and
// Getenv filled in when empty), with an environment of its own.
func (m *mesh) sidecar(cfg Config) *running {
	m.t.Helper()
	e := m.env()
	if cfg.Listen == "" && !cfg.Direct {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Getenv == nil {
		cfg.Getenv = func(string) string { return "" }
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	if cfg.ReadyInterval == 0 {
		cfg.ReadyInterval = 20 * time.Millisecond
	}
	if cfg.Drain == 0 {
		cfg.Drain = -1
	}
	r := &running{out: new(buftest.Buffer), done: make(chan error, 1)}
	cfg.Out = r.out
	s, err := Listen(cfg, e.Registry, e.Engine)
	if err != nil {
		m.t.Fatal(err)
	}
	r.Sidecar = s
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- s.Run(ctx) }() // owned by the test: stopped at cleanup
	m.t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// waitRegistered waits until the sidecar has registered, and returns the
// address it did at.
func (r *running) waitRegistered(t testing.TB) string {
	t.Helper()
	deadline := time.Now().Add(patience)
	for r.Registered() == "" {
		if time.Now().After(deadline) {
			t.Fatalf("the sidecar did not register; it printed:\n%s", r.out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return r.Registered()
}

// proxyClient is an HTTP client whose proxy is the sidecar's outbound one,
// as an app with HTTP_PROXY set.
func (r *running) proxyClient(t testing.TB) *http.Client {
	u, _ := url.Parse("http://" + r.ProxyAddr().String())
	tr := &http.Transport{Proxy: http.ProxyURL(u), MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: patience}
}

// app is a plain net/http app that knows nothing of lanes: it answers with
// its name, and keeps the headers of the last request.
type app struct {
	name string
	srv  *httptest.Server
	hits atomic.Int64

	mu   sync.Mutex
	last http.Header
}

func newApp(t testing.TB, name string, h http.HandlerFunc) *app {
	t.Helper()
	a := &app{name: name}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.hits.Add(1)
		a.mu.Lock()
		a.last = r.Header.Clone()
		a.mu.Unlock()
		if h != nil {
			h(w, r)
			return
		}
		io.WriteString(w, name)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *app) addr() string { return a.srv.Listener.Addr().String() }

func (a *app) header() http.Header {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last
}

// register registers a lanes-unaware instance of service in lane l at
// addr, directly, until the test ends.
func (m *mesh) register(service, id, l, addr string) registry.Lease {
	m.t.Helper()
	e := m.env()
	lease, err := e.Registry.Register(context.Background(), registry.Instance{Service: service, ID: id, Lane: l, Addr: addr}, 0)
	if err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() { lease.Close() })
	return lease
}

// waitListed waits until e's engine lists (or, with !want, no longer
// lists) the instance of service at addr.
func waitListed(t testing.TB, e *routing.Engine, service, addr string, want bool) {
	t.Helper()
	svc := e.Service(service)
	deadline := time.Now().Add(patience)
	for {
		found := false
		for _, in := range svc.Instances() {
			found = found || in.Addr == addr
		}
		if found == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s at %s listed: %v, want %v", service, addr, found, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// get sends a GET to url with c, with the headers kv, and returns the
// status, the X-Lanes-Error header and the body.
func get(t testing.TB, c *http.Client, url string, kv ...string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i] == "Host" {
			req.Host = kv[i+1]
			continue
		}
		req.Header.Set(kv[i], kv[i+1])
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header.Get("X-Lanes-Error"), string(body)
}
