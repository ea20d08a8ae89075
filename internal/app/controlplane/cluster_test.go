package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/lanesgrpc"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// The lanes-up cluster tests run the control plane on a three-member etcd
// cluster of Debian's etcd processes, with the workload of the issue that
// found the paused-member fault: three instances of web heartbeating
// through the admin API with a 6s TTL, a request through the gateway every
// 50ms, and a service's laneshttp client (its own engine on its own etcd
// client) calling web every 50ms. They count failed requests and samples in
// which the gateway's engine did not see all three instances.

const upTTL = 6 * time.Second

type upWorkload struct {
	t       *testing.T
	c       *etcdtest.Cluster
	srv     *Server
	engine  *routing.Engine
	adminAt string
	gateway string
	admin   *adminclient.Client
	leases  []registry.Lease

	stop    chan struct{}
	wg      sync.WaitGroup
	sent    atomic.Int64
	failed  atomic.Int64
	missing atomic.Int64 // samples with fewer than three instances
	mu      sync.Mutex
	errs    []string
}

func startUp(t *testing.T, c *etcdtest.Cluster, mod func(*Config)) *upWorkload {
	t.Helper()
	cfg := Defaults()
	cfg.DataDir = t.TempDir()
	cfg.AdminAddr, cfg.GatewayAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Nats.Addr = NatsOff
	cfg.Traces.GRPCAddr, cfg.Traces.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Etcd.Endpoints = c.Endpoints()
	cfg.Routes = []string{"/=web"}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv, err := Start(ctx, cfg, WithLogger(NewLogger(testWriter{t}, "warn")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	w := &upWorkload{t: t, c: c, srv: srv, stop: make(chan struct{})}
	a, _ := Value(srv, AdminKey)
	gw, _ := Value(srv, GatewayKey)
	w.engine, _ = Value(srv, EngineKey)
	w.adminAt, w.gateway = a.URL, gw.URL
	w.admin, err = adminclient.New(a.URL, a.Token)
	if err != nil {
		t.Fatal(err)
	}
	reg := adminclient.NewRegistry(w.admin)
	t.Cleanup(func() { reg.Close() })
	for i := range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })}
		go hs.Serve(ln)
		t.Cleanup(func() { hs.Close() })
		l, err := reg.Register(ctx, registry.Instance{Service: "web", ID: fmt.Sprintf("web-%d", i), Addr: ln.Addr().String()}, upTTL)
		if err != nil {
			t.Fatal(err)
		}
		w.leases = append(w.leases, l)
	}
	for i := range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		healthpb.RegisterHealthServer(gs, health.NewServer())
		go gs.Serve(ln)
		t.Cleanup(gs.Stop)
		l, err := reg.Register(ctx, registry.Instance{Service: "hello", ID: fmt.Sprintf("hello-%d", i), Addr: ln.Addr().String()}, upTTL)
		if err != nil {
			t.Fatal(err)
		}
		w.leases = append(w.leases, l)
	}
	waitSees(t, w.engine, "web", 3)
	waitSees(t, w.engine, "hello", 3)
	return w
}

// waitSees waits until e sees n instances of service.
func waitSees(t *testing.T, e *routing.Engine, service string, n int) time.Duration {
	t.Helper()
	start := time.Now()
	svc := e.Service(service)
	for got := -1; got != n; {
		d, err := svc.Resolve(routing.Request{})
		got = 0
		if err == nil {
			got = len(d.Eligible)
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("the engine sees %d instances of %s, want %d", got, service, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// run sends the traffic and samples the engine until finish.
func (w *upWorkload) run(sdk *sdkService) {
	gw := &http.Client{Timeout: 5 * time.Second}
	callers := map[string]func() error{
		"gateway": func() error { return get(gw, w.gateway+"/") },
	}
	if sdk != nil {
		callers["laneshttp"] = func() error { return get(sdk.http, "http://web/") }
		hc := healthpb.NewHealthClient(sdk.grpc)
		callers["lanesgrpc"] = func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
			return err
		}
	}
	for name, call := range callers {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-w.stop:
					return
				case <-tick.C:
				}
				w.sent.Add(1)
				if err := call(); err != nil {
					w.failed.Add(1)
					w.mu.Lock()
					w.errs = append(w.errs, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), name, err))
					w.mu.Unlock()
				}
			}
		}()
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		web, hello := w.engine.Service("web"), w.engine.Service("hello")
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			if d, err := web.Resolve(routing.Request{}); err != nil || len(d.Eligible) != 3 {
				w.missing.Add(1)
			}
			if d, err := hello.Resolve(routing.Request{}); err != nil || len(d.Eligible) != 3 {
				w.missing.Add(1)
			}
		}
	}()
}

func (w *upWorkload) finish() (sent, failed, missing int64, errs []string) {
	close(w.stop)
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sent.Load(), w.failed.Load(), w.missing.Load(), w.errs
}

func get(c *http.Client, url string) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// health returns the status of /healthz.
func (w *upWorkload) health() (int, string) {
	hc := &http.Client{Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(w.adminAt + "/healthz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
	}
	json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body.Status
}

// sdkService is what a service's process has: an engine of its own, which
// follows the registry through its own etcd client, and clients of both
// transports on it.
type sdkService struct {
	engine *routing.Engine
	http   *http.Client
	grpc   *grpc.ClientConn
}

func newSDKService(t *testing.T, c *etcdtest.Cluster) *sdkService {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: c.Endpoints(), TLS: c.ClientTLS()})
	if err != nil {
		t.Fatal(err)
	}
	e := routing.New(routing.WithRegistry(st), routing.WithPolicyStore(st.Policy()))
	t.Cleanup(func() { e.Close(); st.Close() })
	hc := laneshttp.NewClient(e)
	hc.Timeout = 5 * time.Second
	conn, err := lanesgrpc.NewClient(e, "hello", lanesgrpc.WithIdempotent("/grpc.health.v1.Health/*"),
		lanesgrpc.WithDialOptions(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &sdkService{engine: e, http: hc, grpc: conn}
}

// TestUpClusterFaults runs lanes up on a three-member etcd cluster and
// fails its members under the workload: the leader killed with SIGKILL,
// then the new leader paused (SIGSTOP) for longer than the TTL. No request
// fails and the gateway never misses an instance.
func TestUpClusterFaults(t *testing.T) {
	t.Parallel()
	c := etcdtest.NewCluster(t, etcdtest.ClusterConfig{})
	w := startUp(t, c, nil)
	sdk := newSDKService(t, c)
	waitSees(t, sdk.engine, "web", 3)
	waitSees(t, sdk.engine, "hello", 3)
	w.run(sdk)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	leader, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := leader.Kill(); err != nil {
		t.Fatal(err)
	}
	// A registration made during the election, through the admin API:
	// both engines (the gateway's and the service's) see it.
	reg := adminclient.NewRegistry(w.admin)
	defer reg.Close()
	regFailed := 0
	for {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := reg.Register(rctx, registry.Instance{Service: "api", ID: "during", Addr: "127.0.0.1:1"}, upTTL)
		rcancel()
		if err == nil {
			break
		}
		regFailed++
		t.Logf("register during the election: %v", err)
		time.Sleep(100 * time.Millisecond)
	}
	waitSees(t, w.engine, "api", 1)
	waitSees(t, sdk.engine, "api", 1)
	seen := time.Since(start)
	if _, err := c.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(start.Add(upTTL + 2*time.Second)))
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	sent, failed, missing, errs := w.counts()
	t.Logf("etcd leader %s killed: %d requests, %d failed, %d engine samples missing an instance; a registration made during the election: %d failed calls, seen by both engines %.2fs after the kill", leader.Name, sent, failed, missing, regFailed, seen.Seconds())
	if failed > 0 || missing > 0 {
		t.Errorf("after the leader was killed: %d of %d requests failed, %d samples missed an instance: %v", failed, sent, missing, errs)
	}

	leader, err = c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w.reset()
	start = time.Now()
	if err := leader.Pause(); err != nil {
		t.Fatal(err)
	}
	degraded := false
	for time.Since(start) < upTTL+4*time.Second {
		if code, st := w.health(); code == http.StatusOK && st == "degraded" {
			degraded = true
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := leader.Resume(); err != nil {
		t.Fatal(err)
	}
	paused := time.Since(start)
	sent, failed, missing, errs = w.finish()
	t.Logf("etcd leader %s paused for %.1fs: %d requests, %d failed, %d engine samples missing an instance", leader.Name, paused.Seconds(), sent, failed, missing)
	if failed > 0 || missing > 0 {
		t.Errorf("while the leader was paused: %d of %d requests failed, %d samples missed an instance: %v", failed, sent, missing, errs)
	}
	if !degraded {
		t.Error("/healthz never said degraded while a member was paused")
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, st := w.health()
		if code == http.StatusOK && st == "ok" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz after the member resumed: %d %s", code, st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// counts returns the counts so far without stopping the workload.
func (w *upWorkload) counts() (sent, failed, missing int64, errs []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sent.Load(), w.failed.Load(), w.missing.Load(), append([]string(nil), w.errs...)
}

// reset zeroes the counts.
func (w *upWorkload) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sent.Store(0)
	w.failed.Store(0)
	w.missing.Store(0)
	w.errs = nil
}

// TestUpClusterQuorumLost kills two of the three members under the
// workload: the gateway keeps routing from the last state it saw, /healthz
// answers 503 no_quorum, a registration is refused at once with an error
// that says why; when the members are back, everything recovers by itself
// and no registration is lost.
func TestUpClusterQuorumLost(t *testing.T) {
	t.Parallel()
	c := etcdtest.NewCluster(t, etcdtest.ClusterConfig{})
	w := startUp(t, c, nil)
	w.run(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	down := c.Members[:2]
	for _, m := range down {
		if err := m.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	for {
		if code, st := w.health(); code == http.StatusServiceUnavailable && st == "no_quorum" {
			break
		}
		if time.Since(start) > etcdstore.DefaultQuorumTimeout+15*time.Second {
			t.Fatal("/healthz never said no_quorum")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("/healthz said no_quorum %.1fs after two members were killed", time.Since(start).Seconds())
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	before := time.Now()
	_, err := w.admin.Register(rctx, adminapi.RegisterRequest{Instance: registry.Instance{Service: "api", ID: "late", Addr: "127.0.0.1:1"}, TTL: adminapi.Duration(upTTL)})
	rcancel()
	if !adminapi.IsCode(err, adminapi.CodeUnavailable) || !strings.Contains(err.Error(), "no quorum") {
		t.Fatalf("register without a quorum: %v; want 503 naming the lost quorum", err)
	}
	if d := time.Since(before); d > 3*time.Second {
		t.Errorf("the refusal took %s; want it at once", d)
	}
	t.Logf("refused in %s: %v", time.Since(before).Round(time.Millisecond), err)
	time.Sleep(time.Until(start.Add(upTTL + 2*time.Second)))
	sent, failed, missing, errs := w.counts()
	t.Logf("quorum lost for %.1fs: %d requests, %d failed, %d engine samples missing an instance", time.Since(start).Seconds(), sent, failed, missing)
	if failed > 0 || missing > 0 {
		t.Errorf("without a quorum: %d of %d requests failed, %d samples missed an instance: %v", failed, sent, missing, errs)
	}
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	for {
		if code, st := w.health(); code == http.StatusOK && st == "ok" {
			break
		}
		if time.Since(back) > 20*time.Second {
			t.Fatal("/healthz did not recover")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := w.admin.Register(ctx, adminapi.RegisterRequest{Instance: registry.Instance{Service: "api", ID: "late", Addr: "127.0.0.1:1"}, TTL: adminapi.Duration(upTTL)}); err != nil {
		t.Fatalf("register after the quorum is back: %v", err)
	}
	t.Logf("/healthz ok %.1fs after the members were started again", time.Since(back).Seconds())
	// The three registrations outlive the outage: a TTL later they are
	// all still there, and none went missing meanwhile.
	time.Sleep(upTTL)
	sent, failed, missing, errs = w.finish()
	if failed > 0 || missing > 0 {
		t.Errorf("over the outage and the recovery: %d of %d requests failed, %d samples missed an instance: %v", failed, sent, missing, errs)
	}
}

// TestUpClusterTLSAuth runs lanes up on a cluster that takes clients over
// TLS with client certificates and has auth on, as docs/operations.md
// describes: it starts with every endpoint listed, serves, and reports
// every member up.
func TestUpClusterTLSAuth(t *testing.T) {
	t.Parallel()
	c := etcdtest.NewCluster(t, etcdtest.ClusterConfig{TLS: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.EnableAuth(ctx, "lanes", "lanes-secret", "/lanes/"); err != nil {
		t.Fatal(err)
	}
	w := startUp(t, c, func(cfg *Config) {
		cfg.Etcd.CA, cfg.Etcd.Cert, cfg.Etcd.Key = c.TLS.CA, c.TLS.ClientCert, c.TLS.ClientKey
		cfg.Etcd.Username, cfg.Etcd.Password = "lanes", "lanes-secret"
	})
	var body struct {
		Status  string `json:"status"`
		Members []struct {
			Endpoint, State string
		} `json:"members"`
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(w.adminAt + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		up := 0
		for _, m := range body.Members {
			if m.State == etcdstore.MemberUp {
				up++
			}
		}
		if body.Status == "ok" && up == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz on a TLS cluster with auth: %+v", body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
