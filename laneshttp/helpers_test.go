package laneshttp_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/testkit/timing"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// patience bounds every wait for something asynchronous (a registry watch
// reaching the engine) and every call (bg): generous, for a loaded 2-core
// machine, and scaled under -race, where a call that moves a 48 MB body
// past a paused instance can take half a minute.
var patience = timing.Bound(30 * time.Second)

// noEnv is a getenv that sees no LANES_* variable, so that tests do not
// depend on the environment they run in.
func noEnv(string) string { return "" }

// quiet is a logger that drops everything.
var quiet = slog.New(slog.DiscardHandler)

// fleet is an in-memory registry and policy store, and an engine following
// them, for tests over real loopback HTTP.
type fleet struct {
	t   *testing.T
	reg *registry.Memory
	pol *policy.Memory
	e   *routing.Engine
}

func newFleet(t *testing.T, pol string, opts ...routing.Option) *fleet {
	t.Helper()
	f := &fleet{t: t, reg: registry.NewMemory(), pol: policy.NewMemory()}
	if pol != "" {
		if _, err := f.pol.Put(context.Background(), []byte(pol)); err != nil {
			t.Fatal(err)
		}
	}
	f.e = routing.New(append([]routing.Option{routing.WithRegistry(f.reg), routing.WithPolicyStore(f.pol), routing.WithLogger(quiet)}, opts...)...)
	t.Cleanup(func() {
		f.e.Close()
		f.reg.Close()
	})
	select { // the store held the policy before the engine started
	case <-f.e.PolicyReady():
	case <-time.After(patience):
		t.Fatal("the engine did not read the policy")
	}
	return f
}

// backend is one instance of a service: a real loopback HTTP server.
type backend struct {
	id    string
	inst  registry.Instance
	srv   *httptest.Server
	lease registry.Lease
	hits  atomic.Int64
	// status is the status to answer; 0 means 200.
	status atomic.Int32

	mu   sync.Mutex
	last *http.Request // the last request, with a copy of its headers
	body string        // the last request body
}

// answer is what a backend's default handler writes: its id.
func (b *backend) handle(w http.ResponseWriter, r *http.Request) {
	b.hits.Add(1)
	body, _ := io.ReadAll(r.Body)
	b.mu.Lock()
	rc := r.Clone(context.Background()) //lanes:ignore a copy kept for the test to read after the request ended
	b.last, b.body = rc, string(body)
	b.mu.Unlock()
	if s := b.status.Load(); s != 0 {
		w.WriteHeader(int(s))
	}
	fmt.Fprint(w, b.id)
}

// lastRequest returns the last request the backend served.
func (b *backend) lastRequest() (*http.Request, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last, b.body
}

// spec of an instance: "id service [lane=x] [zone=x] [host=x]".
func parseSpec(t *testing.T, spec string) registry.Instance {
	t.Helper()
	f := strings.Fields(spec)
	in := registry.Instance{ID: f[0], Service: f[1]}
	for _, kv := range f[2:] {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "lane":
			in.Lane = v
		case "zone":
			in.Zone = v
		case "host":
			in.Host = v
		default:
			t.Fatalf("bad spec %q", spec)
		}
	}
	return in
}

// start runs a backend for spec and registers it. wrap, when given, wraps
// the backend's handler (with the lanes middleware, for example); it
// receives the instance as it will be registered.
func (f *fleet) start(spec string, wrap ...func(registry.Instance, http.Handler) http.Handler) *backend {
	t := f.t
	t.Helper()
	b := &backend{inst: parseSpec(t, spec)}
	b.id = b.inst.ID
	var h http.Handler = http.HandlerFunc(b.handle)
	srv := httptest.NewUnstartedServer(nil)
	b.inst.Addr = srv.Listener.Addr().String()
	for _, w := range wrap {
		h = w(b.inst, h)
	}
	srv.Config.Handler = h
	srv.Start()
	b.srv = srv
	t.Cleanup(srv.Close)
	lease, err := f.reg.Register(context.Background(), b.inst, 0)
	if err != nil {
		t.Fatal(err)
	}
	b.lease = lease
	t.Cleanup(func() { lease.Close() })
	return b
}

// await waits until the engine knows n instances of service.
func (f *fleet) await(service string, n int) {
	f.t.Helper()
	svc := f.e.Service(service)
	waitFor(f.t, fmt.Sprintf("%d instances of %s", n, service), func() bool { return len(svc.Instances()) == n })
}

// client returns an http.Client on a lanes Transport over a base transport of
// its own, whose idle connections are closed at the end of the test.
func (f *fleet) client(opts ...laneshttp.ClientOption) *http.Client {
	base := &http.Transport{}
	f.t.Cleanup(base.CloseIdleConnections)
	opts = append([]laneshttp.ClientOption{laneshttp.WithBase(base), laneshttp.WithEnv(noEnv)}, opts...)
	return laneshttp.NewClient(f.e, opts...)
}

// plainClient returns an http.Client on a transport of its own.
func plainClient(t *testing.T) *http.Client {
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	return &http.Client{Transport: base}
}

// call makes a request and returns the status and body; err is the
// request's error.
func call(ctx context.Context, c *http.Client, method, url string, body io.Reader, hdr ...string) (int, string, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return 0, "", nil, err
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	res, err := c.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), res.Header, err
}

// get makes a GET and fails the test on an error.
func get(t *testing.T, ctx context.Context, c *http.Client, url string, hdr ...string) (int, string) {
	t.Helper()
	code, body, _, err := call(ctx, c, http.MethodGet, url, nil, hdr...)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return code, body
}

// waitFor polls cond until it holds, failing the test after patience.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	timing.Until(t, what, patience, cond)
}

// bg is the context of test requests: cancelled at the end of the test, and
// bounded by patience.
func bg(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	t.Cleanup(cancel)
	return ctx
}

func httptestRecorder() *httptest.ResponseRecorder { return httptest.NewRecorder() }

// httptestServer serves h on a loopback port until the end of the test.
func httptestServer(t *testing.T, h http.Handler) *httptest.Server {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// guardFor returns a guard of e that guards inst.
func guardFor(e *routing.Engine, inst registry.Instance) *laneshttp.Guard {
	g := laneshttp.NewGuard(e)
	g.SetInstance(inst)
	return g
}
