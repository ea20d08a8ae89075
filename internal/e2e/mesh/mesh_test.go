package mesh

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/internal/testkit/leaktest"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesgrpc"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// The chain under test:
//
//	entry --HTTP--> A --gRPC unary--> B --goroutine, HTTP--> C --gRPC stream--> D
//
// Every service has a baseline instance; B, C and D have feature-x
// instances (C's and D's in child processes, to be killed), C an alice
// instance. Each hop answers with the hops below it, so the entry sees which
// instance served each service.

const (
	childEnv = "LANES_MESHTEST_CHILD" // the instance a child process runs: d-fx or c-fx
	etcdEnv  = "LANES_MESHTEST_ETCD"
	ttl      = 2 * time.Second // lease TTL of every instance
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChild()
		return
	}
	goleak.VerifyTestMain(m, leaktest.Options()...)
}

// hop is one service's part of the answer.
type hop struct {
	Service  string `json:"service"`
	Instance string `json:"instance"`
	Lane     string `json:"lane"` // the lane the hop saw in its context
}

func ids(hops []hop) string {
	var s []string
	for _, h := range hops {
		s = append(s, h.Instance)
	}
	return strings.Join(s, " ")
}

// node is the lanes side of one process: its registry and routing engine.
type node struct {
	reg    *etcdstore.Store
	engine *routing.Engine
	http   *http.Client
	b, d   testgrpc.TestServiceClient
	conns  []*grpc.ClientConn
}

func newNode(t testing.TB, endpoints []string) *node {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := etcdstore.Open(ctx, etcdstore.Config{Endpoints: endpoints})
	if err != nil {
		t.Fatal(err)
	}
	n := &node{reg: st, engine: routing.New(routing.WithRegistry(st), routing.WithPolicyStore(st.Policy()))}
	n.http = laneshttp.NewClient(n.engine)
	for _, svc := range []string{"b", "d"} {
		cc, err := lanesgrpc.NewClient(n.engine, svc,
			lanesgrpc.WithDialOptions(grpc.WithTransportCredentials(insecure.NewCredentials())),
			lanesgrpc.WithIdempotent("/grpc.testing.TestService/UnaryCall", "/grpc.testing.TestService/StreamingOutputCall"))
		if err != nil {
			t.Fatal(err)
		}
		n.conns = append(n.conns, cc)
	}
	n.b, n.d = testgrpc.NewTestServiceClient(n.conns[0]), testgrpc.NewTestServiceClient(n.conns[1])
	return n
}

func (n *node) close() {
	for _, cc := range n.conns {
		cc.Close()
	}
	n.http.CloseIdleConnections()
	n.engine.Close()
	n.reg.Close()
}

// fleet runs instances in this process; each one stops when its context is
// cancelled, and close waits for all of them.
type fleet struct {
	t  testing.TB
	n  *node
	wg sync.WaitGroup
}

func self(ctx context.Context, inst registry.Instance) hop {
	return hop{Service: inst.Service, Instance: inst.ID, Lane: lane.FromContext(ctx)}
}

func listen(t testing.TB) net.Listener {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

func writeHops(w http.ResponseWriter, hops []hop, err error) {
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	json.NewEncoder(w).Encode(hops)
}

// serveHTTP runs an HTTP instance whose /chain handler calls next.
func (f *fleet) serveHTTP(ctx context.Context, inst registry.Instance, next func(ctx context.Context) ([]hop, error)) {
	mux := http.NewServeMux()
	mux.HandleFunc("/chain", func(w http.ResponseWriter, r *http.Request) {
		hops, err := next(r.Context())
		writeHops(w, append([]hop{self(r.Context(), inst)}, hops...), err)
	})
	lis := listen(f.t)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		err := laneshttp.Serve(ctx, &http.Server{Handler: mux}, lis, f.n.reg, inst,
			laneshttp.WithGuard(laneshttp.NewGuard(f.n.engine)), laneshttp.WithTTL(ttl))
		if err != nil {
			f.t.Errorf("serving %s: %v", inst.ID, err)
		}
	}()
}

// serveGRPC runs a gRPC instance of the test service.
func serveGRPC(ctx context.Context, n *node, inst registry.Instance, impl testgrpc.TestServiceServer, lis net.Listener) error {
	srv := lanesgrpc.NewServer(lanesgrpc.WithGuard(lanesgrpc.NewGuard(n.engine)))
	testgrpc.RegisterTestServiceServer(srv, impl)
	return lanesgrpc.Serve(ctx, srv, lis, n.reg, inst, lanesgrpc.WithTTL(ttl))
}

func (f *fleet) serveGRPC(ctx context.Context, inst registry.Instance, impl testgrpc.TestServiceServer) {
	lis := listen(f.t)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		if err := serveGRPC(ctx, f.n, inst, impl, lis); err != nil {
			f.t.Errorf("serving %s: %v", inst.ID, err)
		}
	}()
}

// serviceB answers UnaryCall by handing the call to C to a goroutine: the
// goroutine's context is detached from the call's, and keeps its lane.
type serviceB struct {
	testgrpc.UnimplementedTestServiceServer
	inst registry.Instance
	n    *node
	wg   *sync.WaitGroup
}

func (s *serviceB) UnaryCall(ctx context.Context, _ *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	type result struct {
		hops []hop
		err  error
	}
	done := make(chan result, 1)
	s.wg.Add(1)
	go func(ctx context.Context) {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		hops, err := getChain(ctx, s.n.http, "http://c/chain")
		done <- result{hops, err}
	}(lane.Detach(ctx))
	r := <-done
	if r.err != nil {
		return nil, r.err
	}
	body, _ := json.Marshal(append([]hop{self(ctx, s.inst)}, r.hops...))
	return &testgrpc.SimpleResponse{Payload: &testgrpc.Payload{Body: body}}, nil
}

// serviceD answers on a server stream.
type serviceD struct {
	testgrpc.UnimplementedTestServiceServer
	inst registry.Instance
}

func (s *serviceD) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, stream grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	body, _ := json.Marshal([]hop{self(stream.Context(), s.inst)})
	return stream.Send(&testgrpc.StreamingOutputCallResponse{Payload: &testgrpc.Payload{Body: body}})
}

func callB(ctx context.Context, n *node) ([]hop, error) {
	resp, err := n.b.UnaryCall(ctx, &testgrpc.SimpleRequest{})
	if err != nil {
		return nil, err
	}
	var hops []hop
	return hops, json.Unmarshal(resp.GetPayload().GetBody(), &hops)
}

func streamD(ctx context.Context, n *node) ([]hop, error) {
	stream, err := n.d.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
	if err != nil {
		return nil, err
	}
	var all []hop
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			return all, nil
		}
		if err != nil {
			return nil, err
		}
		var hops []hop
		if err := json.Unmarshal(msg.GetPayload().GetBody(), &hops); err != nil {
			return nil, err
		}
		all = append(all, hops...)
	}
}

func getChain(ctx context.Context, c *http.Client, url string) ([]hop, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	var hops []hop
	return hops, json.Unmarshal(body, &hops)
}

func inst(id, service, laneName string) registry.Instance {
	return registry.Instance{ID: id, Service: service, Lane: laneName}
}

// request sends one request into the chain from the entry, in lane l.
func request(n *node, l string) ([]hop, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if l != "" {
		ctx = lane.WithLane(ctx, l)
	}
	return getChain(ctx, n.http, "http://a/chain")
}

// waitPath sends requests in lane l until the chain answers want, and
// returns how long that took.
func waitPath(t *testing.T, n *node, l, want string, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var last string
	for time.Since(start) < limit {
		hops, err := request(n, l)
		if err == nil && ids(hops) == want {
			return time.Since(start)
		}
		last = ids(hops)
		if err != nil {
			last = err.Error()
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("lane %q: after %v the chain answers %q, want %q", l, limit, last, want)
	return 0
}

func TestMeshChain(t *testing.T) {
	etcdtest.Each(t, func(t *testing.T, srv etcdtest.Server) {
		n := newNode(t, srv.Endpoints())
		defer n.close()
		ctx, cancel := context.WithCancel(context.Background())
		f := &fleet{t: t, n: n}
		var bWork sync.WaitGroup
		defer func() {
			cancel()
			f.wg.Wait()
			bWork.Wait()
		}()

		for _, a := range []registry.Instance{inst("a-base", "a", "")} {
			f.serveHTTP(ctx, a, func(ctx context.Context) ([]hop, error) { return callB(ctx, n) })
		}
		for _, b := range []registry.Instance{inst("b-base", "b", ""), inst("b-fx", "b", "feature-x")} {
			f.serveGRPC(ctx, b, &serviceB{inst: b, n: n, wg: &bWork})
		}
		for _, c := range []registry.Instance{inst("c-base", "c", ""), inst("c-alice", "c", "alice")} {
			f.serveHTTP(ctx, c, func(ctx context.Context) ([]hop, error) { return streamD(ctx, n) })
		}
		f.serveGRPC(ctx, inst("d-base", "d", ""), &serviceD{inst: inst("d-base", "d", "")})
		dChild := startChild(t, srv.Endpoints(), "d-fx")
		cChild := startChild(t, srv.Endpoints(), "c-fx")

		// Every lane takes exactly the path of the routing contract.
		waitPath(t, n, "feature-x", "a-base b-fx c-fx d-fx", 20*time.Second)
		for _, c := range []struct{ lane, want, seen string }{
			{"", "a-base b-base c-base d-base", ""},
			{"feature-x", "a-base b-fx c-fx d-fx", "feature-x"},
			{"alice", "a-base b-base c-alice d-base", "alice"},
			{"bob", "a-base b-base c-base d-base", "bob"},
		} {
			for range 5 {
				hops, err := request(n, c.lane)
				if err != nil {
					t.Fatalf("lane %q: %v", c.lane, err)
				}
				if got := ids(hops); got != c.want {
					t.Fatalf("lane %q took %q, want %q", c.lane, got, c.want)
				}
				for _, h := range hops {
					if h.Lane != c.seen {
						t.Fatalf("lane %q: %s saw lane %q in its context, want %q", c.lane, h.Instance, h.Lane, c.seen)
					}
				}
			}
		}

		// Kill D's feature-x instance (gRPC) while feature-x calls flow
		// every 100 ms: feature-x falls back to D's baseline, and no call
		// fails. The refused connection ejects the instance at once; the
		// lease then takes it out of the registry for good.
		// Every call counts: the traffic is the only one. The kill falls
		// between two calls (see traffic.kill).
		tr := startTraffic(n, "feature-x")
		tr.await(t, 3, "a-base b-fx c-fx d-fx")
		killed := tr.kill(t, dChild)
		took := tr.stopAfter(t, "d-fx (gRPC)", 10, "a-base b-fx c-fx d-base").Sub(killed)
		t.Logf("%s: feature-x fell back to d-base %v after the SIGKILL (lease TTL %v)", srv.Kind(), took.Round(time.Millisecond), ttl)
		d := n.engine.Service("d")
		for slices.ContainsFunc(d.Instances(), func(in registry.Instance) bool { return in.ID == "d-fx" }) {
			time.Sleep(20 * time.Millisecond)
		}
		gone := time.Since(killed)
		t.Logf("%s: d-fx left the registry %v after the SIGKILL", srv.Kind(), gone.Round(time.Millisecond))
		// The refused connection ejects d-fx at once: the first call after
		// the kill falls back. etcd checks for expired leases twice a second,
		// later on a loaded machine.
		if took > ttl || gone > 3*ttl {
			t.Fatalf("fallback took %v and expiry %v; want them within %v and %v", took, gone, ttl, 3*ttl)
		}

		// The same for C's feature-x instance (HTTP).
		tr = startTraffic(n, "feature-x")
		tr.await(t, 3, "a-base b-fx c-fx d-base")
		tr.kill(t, cChild)
		tr.stopAfter(t, "c-fx (HTTP)", 10, "a-base b-fx c-base d-base")

		// A new lane instance takes its lane's traffic as soon as the engine sees it
		// (well under a second on an idle machine).
		start := time.Now()
		a2 := inst("a-alice", "a", "alice")
		f.serveHTTP(ctx, a2, func(ctx context.Context) ([]hop, error) { return callB(ctx, n) })
		took = waitPath(t, n, "alice", "a-alice b-base c-alice d-base", 5*time.Second)
		t.Logf("%s: the new alice instance of a took alice's traffic after %v", srv.Kind(), took.Round(time.Millisecond))
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("the new lane instance took %v to take its traffic, want well under 5s", took)
		}
		// Baseline traffic never reaches it.
		for range 5 {
			if hops, err := request(n, ""); err != nil || ids(hops) != "a-base b-base c-base d-base" {
				t.Fatalf("baseline took %q, %v", ids(hops), err)
			}
		}
	})
}

// traffic sends a request in one lane into the chain every 100 ms, and
// records what each got.
type traffic struct {
	stop chan struct{}
	done chan struct{}
	call sync.Mutex // held for each call, and by kill

	mu     sync.Mutex
	calls  int
	errs   []string    // the failed calls
	recent []string    // the paths of the calls, in order
	at     []time.Time // when each call was sent
}

func startTraffic(n *node, l string) *traffic {
	tr := &traffic{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(tr.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tr.stop:
				return
			case <-tick.C:
			}
			tr.call.Lock()
			sent := time.Now()
			hops, err := request(n, l)
			tr.call.Unlock()
			tr.mu.Lock()
			tr.calls++
			tr.at = append(tr.at, sent)
			if err != nil {
				tr.errs = append(tr.errs, fmt.Sprintf("sent at %s: %v", sent.Format("15:04:05.000"), err))
				tr.recent = append(tr.recent, "error")
			} else {
				tr.recent = append(tr.recent, ids(hops))
			}
			tr.mu.Unlock()
		}
	}()
	return tr
}

// kill kills the child with SIGKILL between two calls, waits until it has
// exited, and returns when it sent the signal. The calls after the kill
// find the instance's port closed: a refused connection moves a call on at
// once, and a call on a kept-alive connection that the kill closed is sent
// again by net/http, and refused. A call that the instance had already
// taken when it died fails when its lane has no other instance: a retry
// goes only to an instance that has not failed the call, and one failure
// does not eject the lane's instance (docs/http.md, Retries). On a loaded
// machine a call every 100 ms is in flight at many instants; such a call,
// reset by the kill, made this test fail.
func (tr *traffic) kill(t *testing.T, child *exec.Cmd) time.Time {
	t.Helper()
	tr.call.Lock()
	defer tr.call.Unlock()
	killed := time.Now()
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	child.Wait()
	t.Logf("killed at %s", killed.Format("15:04:05.000"))
	return killed
}

// await waits until the last k calls took path.
func (tr *traffic) await(t *testing.T, k int, path string) bool {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		tr.mu.Lock()
		ok := len(tr.recent) >= k && !slices.ContainsFunc(tr.recent[len(tr.recent)-k:], func(p string) bool { return p != path })
		tr.mu.Unlock()
		if ok {
			return true
		}
		if time.Now().After(deadline) {
			t.Errorf("the last %d calls did not all take %q", k, path)
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stopAfter waits until the last k calls took path, stops the traffic, and
// fails the test if any call failed. It returns when the first of those k
// calls was sent.
func (tr *traffic) stopAfter(t *testing.T, what string, k int, path string) time.Time {
	t.Helper()
	tr.await(t, k, path)
	close(tr.stop)
	<-tr.done
	var first time.Time
	if len(tr.at) >= k {
		first = tr.at[len(tr.at)-k]
	}
	defer t.Logf("SIGKILL of %s, a call every 100 ms: %d calls, %d failed", what, tr.calls, len(tr.errs))
	if len(tr.errs) > 0 {
		t.Errorf("SIGKILL of %s: %d of %d calls failed: %v", what, len(tr.errs), tr.calls, tr.errs)
	}
	return first
}

// startChild runs the feature-x instance id (d-fx or c-fx) in a child
// process (this test binary), and waits until it is registered.
func startChild(t *testing.T, endpoints []string, id string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+id, etcdEnv+"="+strings.Join(endpoints, ","))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "ready" {
			err = fmt.Errorf("child said %q", line)
		}
		ready <- err
		io.Copy(io.Discard, out)
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the child process did not start")
	}
	return cmd
}

// runChild is the child process: it serves D (d-fx, gRPC) or C (c-fx,
// HTTP) in lane feature-x until it is killed.
func runChild() {
	n := newNode(fatalTB{}, strings.Split(os.Getenv(etcdEnv), ","))
	id := os.Getenv(childEnv)
	var in registry.Instance
	switch id {
	case "d-fx":
		in = inst(id, "d", "feature-x")
	case "c-fx":
		in = inst(id, "c", "feature-x")
	default:
		panic("unknown child " + id)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	go func() {
		// Announce readiness once the instance is in the registry.
		w, err := n.reg.Watch(ctx, in.Service)
		if err != nil {
			panic(err)
		}
		var st registry.State
		for {
			b, err := w.Next(ctx)
			if err != nil {
				panic(err)
			}
			st.Apply(b)
			if slices.ContainsFunc(st.Instances(in.Service), func(x registry.Instance) bool { return x.ID == id }) {
				fmt.Println("ready")
				return
			}
		}
	}()
	if in.Service == "d" {
		err = serveGRPC(ctx, n, in, &serviceD{inst: in}, lis)
	} else {
		mux := http.NewServeMux()
		mux.HandleFunc("/chain", func(w http.ResponseWriter, r *http.Request) {
			hops, err := streamD(r.Context(), n)
			writeHops(w, append([]hop{self(r.Context(), in)}, hops...), err)
		})
		err = laneshttp.Serve(ctx, &http.Server{Handler: mux}, lis, n.reg, in, laneshttp.WithGuard(laneshttp.NewGuard(n.engine)), laneshttp.WithTTL(ttl))
	}
	panic(err)
}

// fatalTB lets newNode run outside a test, in the child process.
type fatalTB struct{ testing.TB }

func (fatalTB) Fatal(args ...any) { panic(fmt.Sprint(args...)) }
