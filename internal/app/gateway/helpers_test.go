package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/internal/testkit/leaktest"
	"github.com/lanesdev/lanes/internal/testkit/timing"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// stacks are the HTTP/1.1 stacks (Config.HTTP1) that every gateway test
// runs on, each as a subtest of its own (onStacks).
var stacks = [...]string{HTTP1Fast, HTTP1Std}

// onStacks runs test on every stack, as the subtests http1=fast and
// http1=std; the gateways that test starts (newWorld) serve on the
// subtest's stack (stackOf).
func onStacks(t *testing.T, test func(t *testing.T)) {
	for _, s := range stacks {
		t.Run("http1="+s, test)
	}
}

// stackOf is the stack that t runs on: that of the onStacks subtest it is,
// or is under; the default stack for a test that is under none.
func stackOf(t testing.TB) string {
	name := t.Name()
	for _, s := range stacks {
		if strings.Contains(name, "/http1="+s) {
			return s
		}
	}
	return HTTP1Fast
}

// net/http lingers 500ms on a connection it closes with a request body
// unread (the smuggling tests leave many): that goroutine ends by itself.
// (leaktest.Options has fasthttp's process-wide date updater.)
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leaktest.Options(goleak.IgnoreAnyFunction("net/http.(*conn).closeWriteAndWait"))...)
}

// fastOf is the fast stack of g, nil when g serves HTTP/1.1 on net/http.
func fastOf(g *Gateway) *fastStack {
	f, _ := g.http1.(*fastStack)
	return f
}

// waitFor is how long tests poll for a condition: generous, for a loaded
// machine under -race.
const waitFor = 20 * time.Second

// eventually polls cond until it holds or waitFor passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	timing.Until(t, what, waitFor, cond)
}

// echo is what a test backend answers: who it is and what it received.
type echo struct {
	ID      string              `json:"id"`
	Lane    string              `json:"lane"`
	Method  string              `json:"method"`
	Path    string              `json:"path"`
	RawPath string              `json:"raw_path"`
	Query   string              `json:"query"`
	Host    string              `json:"host"`
	Proto   string              `json:"proto"`
	Header  map[string][]string `json:"header"`
}

// backend is a loopback HTTP server that answers with an echo.
type backend struct {
	id, lane string
	addr     string
	hits     atomic.Int64
	status   atomic.Int32 // 0: 200
	hints    atomic.Bool  // send 103 Early Hints first
	srv      *http.Server
	done     chan struct{}
}

func newBackend(t testing.TB, id, ln string) *backend {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{id: id, lane: ln, addr: l.Addr().String(), done: make(chan struct{})}
	b.srv = &http.Server{Handler: b, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(b.done)
		b.srv.Serve(l)
	}()
	t.Cleanup(b.close)
	return b
}

func (b *backend) close() {
	b.srv.Close()
	<-b.done
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.hits.Add(1)
	io.Copy(io.Discard, r.Body)
	e := echo{ID: b.id, Lane: b.lane, Method: r.Method, Path: r.URL.Path, RawPath: r.URL.RawPath, Query: r.URL.RawQuery,
		Host: r.Host, Proto: r.Proto, Header: r.Header}
	w.Header().Set("Content-Type", "application/json")
	// A stale lane header from upstream must not reach the client.
	w.Header().Set("X-Lane-Served", "from-the-backend")
	if b.hints.Load() {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
	}
	if s := b.status.Load(); s != 0 {
		w.WriteHeader(int(s))
	}
	json.NewEncoder(w).Encode(e)
}

// world is an engine on a memory registry and policy store, and a gateway
// served on a loopback port.
type world struct {
	reg    *registry.Memory
	store  *policy.Memory
	engine *routing.Engine
	gw     *Gateway
	addr   string // the gateway's host:port
	url    string // http://addr
	client *http.Client
}

// send opens a connection to the gateway, sends raw on it and returns a
// reader of what the gateway answers. The connection closes when t ends,
// and every read and write on it must be done within waitFor.
func (w *world) send(t testing.TB, raw string) *bufio.Reader {
	t.Helper()
	c, err := net.DialTimeout("tcp", w.addr, waitFor)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(waitFor))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	return bufio.NewReader(c)
}

// eventStream is an instance's handler that answers with an event stream
// of two events, the second once release is closed (or the request ends).
func eventStream(release <-chan struct{}) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(rw, "data: one\n\n")
		rw.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(rw, "data: two\n\n")
	}
}

// readEvents reads the answer body of an eventStream: the first event
// before it closes release, so that the gateway must pass it on as it
// comes, then the second and the end.
func readEvents(t testing.TB, body io.Reader, release chan<- struct{}) {
	t.Helper()
	br := bufio.NewReader(body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: one\n" {
		t.Fatalf("first event: %q, %v; want it before the instance ends the answer", line, err)
	}
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "\ndata: two\n\n" {
		t.Fatalf("the rest: %q, %v", rest, err)
	}
}

// newWorld builds a world with the policy doc (YAML, "" for none) and a
// gateway configured by cfg (Engine is filled in; Routes default to
// "/" -> orders).
func newWorld(t testing.TB, doc string, cfg Config) *world {
	t.Helper()
	return newWorldWith(t, doc, cfg, nil)
}

// newWorldWith is newWorld, with prep run on the gateway before it serves.
func newWorldWith(t testing.TB, doc string, cfg Config, prep func(*Gateway)) *world {
	t.Helper()
	return newWorldOn(t, doc, cfg, prep, nil, nil)
}

// newWorldOn is newWorldWith, with the gateway serving wrap(l) rather than
// its listener l, when wrap is set; and serving TLS with tc (ServeTLS) when
// tc is not nil, where w.client then trusts nothing: a test brings its own.
func newWorldOn(t testing.TB, doc string, cfg Config, prep func(*Gateway), wrap func(net.Listener) net.Listener, tc *tls.Config) *world {
	t.Helper()
	w := &world{reg: registry.NewMemory(), store: policy.NewMemory()}
	t.Cleanup(func() { w.reg.Close() })
	if doc != "" {
		if _, err := w.store.Put(context.Background(), []byte(doc)); err != nil {
			t.Fatalf("policy: %v", err)
		}
	}
	w.engine = routing.New(routing.WithRegistry(w.reg), routing.WithRegistryLanes(), routing.WithPolicyStore(w.store))
	t.Cleanup(func() { w.engine.Close() })
	cfg.Engine = w.engine
	if cfg.HTTP1 == "" {
		cfg.HTTP1 = stackOf(t)
	}
	if cfg.Routes == nil {
		cfg.Routes = []Route{{Prefix: "/", Service: "orders"}}
	}
	gw, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	w.gw = gw
	if prep != nil {
		prep(gw)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w.addr = l.Addr().String()
	w.url = "http://" + w.addr
	if wrap != nil {
		l = wrap(l)
	}
	served := make(chan error, 1)
	if tc != nil {
		w.url = "https://" + w.addr
		go func() { served <- gw.ServeTLS(l, tc) }()
	} else {
		go func() { served <- gw.Serve(l) }()
	}
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16}
	w.client = &http.Client{Transport: tr, Timeout: waitFor}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		if err := gw.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve returned %v, want http.ErrServerClosed", err)
		}
	})
	return w
}

// register puts an instance of service in the registry and waits until the
// engine routes with it.
func (w *world) register(t testing.TB, service, id, addr, ln string) registry.Lease {
	t.Helper()
	return w.registerInst(t, registry.Instance{ID: id, Service: service, Addr: addr, Lane: ln})
}

func (w *world) registerInst(t testing.TB, in registry.Instance) registry.Lease {
	t.Helper()
	lease, err := w.reg.Register(context.Background(), in, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lease.Close() })
	svc := w.engine.Service(in.Service)
	eventually(t, "the engine to see instance "+in.ID, func() bool {
		for _, got := range svc.Instances() {
			if got.ID == in.ID && got.Addr == in.Addr {
				return true
			}
		}
		return false
	})
	return lease
}

// setPolicy stores doc and waits until the engine has it in force.
func (w *world) setPolicy(t testing.TB, doc string) {
	t.Helper()
	before := w.engine.Policy()
	if _, err := w.store.Put(context.Background(), []byte(doc)); err != nil {
		t.Fatalf("policy: %v", err)
	}
	eventually(t, "the policy to be in force", func() bool { return w.engine.Policy() != before })
}

// reply is one answer of the gateway.
type reply struct {
	status int
	header http.Header
	body   string
	echo   echo // when a backend answered
	proto  string
}

// do sends a request through client and reads the whole answer.
func do(t testing.TB, client *http.Client, method, url string, header map[string]string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		if strings.EqualFold(k, "host") {
			req.Host = v
			continue
		}
		req.Header.Add(k, v)
	}
	return doReq(t, client, req)
}

// uploadReq is a request with body, of known length, or chunked: of a
// length the client does not know, so that it sends the body chunked.
func uploadReq(t testing.TB, method, url string, body io.Reader, chunked bool) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if chunked {
		req.ContentLength, req.Body = -1, io.NopCloser(req.Body)
	}
	return req
}

// doReq sends req through client and reads the whole answer.
func doReq(t testing.TB, client *http.Client, req *http.Request) reply {
	t.Helper()
	method, url := req.Method, req.URL.String()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, url, err)
	}
	r := reply{status: resp.StatusCode, header: resp.Header, body: string(body), proto: resp.Proto}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(body, &r.echo); err != nil {
			t.Fatalf("%s %s: bad echo %q: %v", method, url, body, err)
		}
	}
	return r
}

func (w *world) get(t testing.TB, path string, header map[string]string) reply {
	t.Helper()
	return do(t, w.client, http.MethodGet, w.url+path, header)
}

// clientFrom returns a client whose connections come from the loopback
// address ip (any of 127.0.0.0/8 works on Linux).
func clientFrom(t testing.TB, ip string) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	tr := &http.Transport{Proxy: nil, DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: waitFor}
}

// expectServed checks an answer that a backend gave.
func expectServed(t testing.TB, r reply, id, reqLane string) {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("status %d (%s), want 200 from %s", r.status, strings.TrimSpace(r.body), id)
	}
	if r.echo.ID != id {
		t.Fatalf("served by %q (lane %q), want %q", r.echo.ID, r.echo.Lane, id)
	}
	if got := r.header.Get("X-Lane"); got != reqLane {
		t.Errorf("x-lane = %q, want %q", got, reqLane)
	}
	served := r.echo.Lane
	if served == "" {
		served = "baseline"
	}
	if got := r.header.Values("X-Lane-Served"); len(got) != 1 || got[0] != served {
		t.Errorf("x-lane-served = %q, want [%q]", got, served)
	}
}

// hdr returns the one value of header k that the backend received, or ""
// (failing when there are several).
func (e echo) hdr(t testing.TB, k string) string {
	t.Helper()
	v := http.Header(e.Header).Values(k)
	switch len(v) {
	case 0:
		return ""
	case 1:
		return v[0]
	}
	t.Fatalf("backend got %d values of %s: %q", len(v), k, v)
	return ""
}

// twoLanes registers a baseline backend "base" and an "alice" backend of
// service orders.
func twoLanes(t testing.TB, w *world) (base, alice *backend) {
	t.Helper()
	base = newBackend(t, "base", "")
	alice = newBackend(t, "alice-1", "alice")
	w.register(t, "orders", base.id, base.addr, "")
	w.register(t, "orders", alice.id, alice.addr, "alice")
	return base, alice
}

// routingWorld is a memory registry and an engine following it, without a
// gateway.
func routingWorld(t testing.TB) (*registry.Memory, *routing.Engine) {
	t.Helper()
	reg := registry.NewMemory()
	e := routing.New(routing.WithRegistry(reg))
	t.Cleanup(func() {
		e.Close()
		reg.Close()
	})
	return reg, e
}

// registerAddr registers a baseline instance and waits for the engine.
func registerAddr(t testing.TB, reg *registry.Memory, e *routing.Engine, service, id, addr string) {
	t.Helper()
	lease, err := reg.Register(context.Background(), registry.Instance{ID: id, Service: service, Addr: addr}, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lease.Close() })
	eventually(t, "the engine to see "+id, func() bool { return len(e.Service(service).Instances()) > 0 })
}

// stuckStore is a policy store whose watches never deliver.
type stuckStore struct{}

func (stuckStore) Get(context.Context) (policy.Document, error) { return policy.Empty(), nil }
func (stuckStore) Put(context.Context, []byte) (policy.Document, error) {
	return policy.Document{}, errors.New("read-only")
}
func (stuckStore) Watch(context.Context) (policy.Watcher, error) { return stuckWatcher{}, nil }

type stuckWatcher struct{}

func (stuckWatcher) Next(ctx context.Context) (policy.Document, error) {
	<-ctx.Done()
	return policy.Document{}, ctx.Err()
}
func (stuckWatcher) Close() error { return nil }

// serveBackend serves h on a loopback port until the test ends and returns
// its address.
func serveBackend(tb testing.TB, h http.Handler) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	serveOn(tb, l, h)
	return l.Addr().String()
}

// serveOn serves h on l until the test ends.
func serveOn(tb testing.TB, l net.Listener, h http.Handler) {
	serveServer(tb, l, &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second})
}

// server is what serveServer serves: an *http.Server or a *Gateway.
type server interface {
	Serve(net.Listener) error
	Close() error
}

// serveServer serves srv on l until the test ends.
func serveServer(tb testing.TB, l net.Listener, srv server) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(l)
	}()
	tb.Cleanup(func() {
		srv.Close()
		<-done
	})
}

// acceptLoop listens on a loopback port and hands each connection to handle,
// which owns it, one after another on one goroutine, until the test ends; it
// returns the address.
func acceptLoop(tb testing.TB, handle func(net.Conn)) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			handle(c)
		}
	}()
	tb.Cleanup(func() { l.Close(); <-done })
	return l.Addr().String()
}
