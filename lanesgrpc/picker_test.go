package lanesgrpc

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"
	"google.golang.org/grpc/status"

	"github.com/lanesdev/lanes/internal/lib/routedcall"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

type fakeSC struct {
	balancer.SubConn
	name string
}

// childPicker stands for a pick_first child's picker.
type childPicker struct {
	res balancer.PickResult
	err error
}

func (c *childPicker) Pick(balancer.PickInfo) (balancer.PickResult, error) { return c.res, c.err }

type fakeCC struct {
	balancer.ClientConn
	resolves atomic.Int32
}

func (f *fakeCC) ResolveNow(resolver.ResolveNowOptions) { f.resolves.Add(1) }

// pickFixture is an engine with instances of "orders" and a picker over
// connections in the given states.
type pickFixture struct {
	e  *routing.Engine
	cc *fakeCC
	p  *picker
}

func newPickFixture(t testing.TB, pol string, insts []registry.Instance, states map[string]connectivity.State) *pickFixture {
	t.Helper()
	e := routing.New()
	t.Cleanup(func() { e.Close() })
	if pol != "" {
		p, err := policy.Parse("policy", []byte(pol))
		if err != nil {
			t.Fatal(err)
		}
		e.SetPolicy(p)
	}
	for i := range insts {
		n, err := registry.Normalize(insts[i])
		if err != nil {
			t.Fatal(err)
		}
		insts[i] = n
	}
	e.SetInstances("orders", insts)
	svc := e.Service("orders")
	cc := &fakeCC{}
	f := &pickFixture{e: e, cc: cc}
	conns := map[string]conn{}
	dones := map[string]func(balancer.DoneInfo){}
	for _, in := range insts {
		dones[in.ID] = reportFunc(svc, in.ID)
		st, ok := states[in.ID]
		if !ok {
			continue // no connection yet
		}
		cp := &childPicker{res: balancer.PickResult{SubConn: &fakeSC{name: in.ID}}}
		switch st {
		case connectivity.TransientFailure:
			cp = &childPicker{err: errors.New("connection refused")}
		case connectivity.Connecting, connectivity.Idle:
			cp = &childPicker{err: balancer.ErrNoSubConnAvailable}
		}
		conns[in.Addr] = conn{state: st, picker: cp}
	}
	f.p = &picker{eng: e, svc: svc, conns: conns, dones: dones, b: &lanesBalancer{cc: cc, md: &laneMDCache{}}}
	return f
}

func inst(id, addr, l string) registry.Instance {
	return registry.Instance{ID: id, Service: "orders", Addr: addr, Lane: l}
}

func (f *pickFixture) pick(t testing.TB, ctx context.Context) (string, balancer.PickResult, error) {
	t.Helper()
	pr, err := f.p.Pick(balancer.PickInfo{Ctx: ctx, FullMethodName: "/x.Y/Z"})
	if err != nil {
		return "", pr, err
	}
	return pr.SubConn.(*fakeSC).name, pr, nil
}

func TestPickAllocations(t *testing.T) {
	ready := map[string]connectivity.State{"a": connectivity.Ready, "b": connectivity.Ready, "alice": connectivity.Ready, "c": connectivity.Ready}
	f := newPickFixture(t, "canary:\n  - service: orders\n    lane: canary\n    percent: 50\n", []registry.Instance{
		inst("a", "10.0.0.1:1", ""), inst("b", "10.0.0.2:1", ""),
		inst("alice", "10.0.0.3:1", "alice"), inst("c", "10.0.0.4:1", "canary"),
	}, ready)
	base := context.Background()
	retry := withCallState(lane.WithLane(base, "alice"))
	if _, _, err := f.pick(t, retry); err != nil { // the retry state now names alice
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		ctx  context.Context
	}{
		{"baseline_and_canary", lane.WithKey(base, "user-1")},
		{"random_canary", base},
		{"lane", lane.WithLane(base, "alice")},
		{"unknown_lane", lane.WithLane(base, "zed")},
		{"retry", retry},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 10 { // warm the canary metadata cache
				f.pick(t, tc.ctx)
			}
			n := testing.AllocsPerRun(1000, func() {
				if _, pr, err := f.pick(t, tc.ctx); err != nil {
					t.Fatal(err)
				} else {
					pr.Done(balancer.DoneInfo{BytesSent: true})
				}
			})
			if n != 0 {
				t.Fatalf("Pick and Done allocate %.1f times per call", n)
			}
		})
	}
}

func TestPickCanaryMetadata(t *testing.T) {
	ready := map[string]connectivity.State{"a": connectivity.Ready, "c": connectivity.Ready}
	f := newPickFixture(t, "canary:\n  - service: orders\n    lane: canary\n    percent: 100\n",
		[]registry.Instance{inst("a", "10.0.0.1:1", ""), inst("c", "10.0.0.4:1", "canary")}, ready)
	got, pr, err := f.pick(t, context.Background())
	if err != nil || got != "c" {
		t.Fatalf("picked %s, %v", got, err)
	}
	if v := pr.Metadata.Get(lane.Header); len(v) != 1 || v[0] != "canary" {
		t.Fatalf("metadata %v", pr.Metadata)
	}
	if v := pr.Metadata.Get(lane.BaggageHeader); len(v) != 1 || v[0] != "lane=canary" {
		t.Fatalf("metadata %v", pr.Metadata)
	}
	// A request that carries its lane gets no extra metadata: the
	// interceptor wrote it.
	f2 := newPickFixture(t, "", []registry.Instance{inst("alice", "10.0.0.3:1", "alice")}, map[string]connectivity.State{"alice": connectivity.Ready})
	if _, pr, err := f2.pick(t, lane.WithLane(context.Background(), "alice")); err != nil || pr.Metadata != nil {
		t.Fatalf("lane request: metadata %v, %v", pr.Metadata, err)
	}
}

func TestPickNotReady(t *testing.T) {
	insts := func() []registry.Instance {
		return []registry.Instance{inst("a", "10.0.0.1:1", ""), inst("b", "10.0.0.2:1", "")}
	}
	t.Run("skips_connecting", func(t *testing.T) {
		f := newPickFixture(t, "", insts(), map[string]connectivity.State{"a": connectivity.Connecting, "b": connectivity.Ready})
		for range 10 {
			if got, _, err := f.pick(t, context.Background()); err != nil || got != "b" {
				t.Fatalf("picked %s, %v", got, err)
			}
		}
	})
	t.Run("waits_while_connecting", func(t *testing.T) {
		f := newPickFixture(t, "", insts(), map[string]connectivity.State{"a": connectivity.Connecting, "b": connectivity.Idle})
		if _, _, err := f.pick(t, context.Background()); err != balancer.ErrNoSubConnAvailable {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("asks_the_resolver_once", func(t *testing.T) {
		f := newPickFixture(t, "", insts(), map[string]connectivity.State{})
		for range 3 {
			if _, _, err := f.pick(t, context.Background()); err != balancer.ErrNoSubConnAvailable {
				t.Fatalf("got %v", err)
			}
		}
		if n := f.cc.resolves.Load(); n != 1 {
			t.Fatalf("%d ResolveNow calls, want 1 until the resolver answers", n)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		f := newPickFixture(t, "", insts(), map[string]connectivity.State{"a": connectivity.TransientFailure, "b": connectivity.TransientFailure})
		_, _, err := f.pick(t, context.Background())
		var ue *unreachableError
		if !errors.As(err, &ue) || status.Code(err) != codes.Unknown {
			t.Fatalf("got %v; want a plain error, which gRPC turns into Unavailable", err)
		}
		for _, s := range []string{`"orders"`, "baseline request", "connection refused"} {
			if !strings.Contains(err.Error(), s) {
				t.Fatalf("%q lacks %q", err, s)
			}
		}
	})
	t.Run("failed_connections_eject", func(t *testing.T) {
		// alice's only instance cannot connect: the first Pick that meets
		// it ejects it, asks again, and falls back to the baseline.
		f := newPickFixture(t, "", []registry.Instance{inst("alice", "10.0.0.3:1", "alice"), inst("b", "10.0.0.2:1", "")},
			map[string]connectivity.State{"alice": connectivity.TransientFailure, "b": connectivity.Ready})
		ctx := lane.WithLane(context.Background(), "alice")
		for i := range 3 {
			if got, _, err := f.pick(t, ctx); err != nil || got != "b" {
				t.Fatalf("pick %d: alice's request went to %s, %v; want the baseline at once", i, got, err)
			}
		}
	})
	t.Run("routing_error", func(t *testing.T) {
		f := newPickFixture(t, "lanes:\n  solo: {strict: true}\n", insts(), map[string]connectivity.State{"a": connectivity.Ready})
		_, _, err := f.pick(t, lane.WithLane(context.Background(), "solo"))
		if status.Code(err) != codes.Unavailable || !strings.HasPrefix(status.Convert(err).Message(), "lanes: lane_unavailable: ") ||
			!strings.Contains(err.Error(), `"solo"`) {
			t.Fatalf("got %v", err)
		}
	})
}

func TestPickAvoidsLastAttempt(t *testing.T) {
	f := newPickFixture(t, "", []registry.Instance{inst("a", "10.0.0.1:1", ""), inst("b", "10.0.0.2:1", "")},
		map[string]connectivity.State{"a": connectivity.Ready, "b": connectivity.Ready})
	for range 20 {
		ctx := withCallState(context.Background())
		first, _, err := f.pick(t, ctx)
		if err != nil {
			t.Fatal(err)
		}
		second, _, err := f.pick(t, ctx)
		if err != nil || second == first {
			t.Fatalf("retry went to %s after %s (%v)", second, first, err)
		}
	}
	// With one instance, the retry goes to it all the same.
	f = newPickFixture(t, "", []registry.Instance{inst("a", "10.0.0.1:1", "")}, map[string]connectivity.State{"a": connectivity.Ready})
	ctx := withCallState(context.Background())
	for range 2 {
		if got, _, err := f.pick(t, ctx); err != nil || got != "a" {
			t.Fatalf("picked %s, %v", got, err)
		}
	}
}

func TestOutcome(t *testing.T) {
	for _, tc := range []struct {
		di   balancer.DoneInfo
		want routedcall.Outcome
	}{
		{balancer.DoneInfo{BytesSent: true}, routedcall.Success},
		{balancer.DoneInfo{}, routedcall.Ignore},
		{balancer.DoneInfo{Err: status.Error(codes.Unavailable, "x")}, routedcall.Failure},
		{balancer.DoneInfo{Err: status.Error(codes.DeadlineExceeded, "x")}, routedcall.Ignore},
		{balancer.DoneInfo{Err: status.Error(codes.Canceled, "x")}, routedcall.Ignore},
		{balancer.DoneInfo{Err: status.Error(codes.Internal, "x")}, routedcall.Success},
		{balancer.DoneInfo{Err: status.Error(codes.Unknown, "x")}, routedcall.Success},
		{balancer.DoneInfo{Err: status.Error(codes.NotFound, "x")}, routedcall.Success},
		{balancer.DoneInfo{Err: status.Error(codes.ResourceExhausted, "x")}, routedcall.Success},
	} {
		if got := outcome(tc.di); got != tc.want {
			t.Errorf("%v: outcome %v, want %v", tc.di.Err, got, tc.want)
		}
	}
}

// fakeSource is a source with the change notification proposed to routing.
type fakeSource struct {
	ready   chan struct{}
	insts   atomic.Pointer[[]registry.Instance]
	changed atomic.Pointer[chan struct{}]
}

func newFakeSource() *fakeSource {
	s := &fakeSource{ready: make(chan struct{})}
	ch := make(chan struct{})
	s.changed.Store(&ch)
	s.insts.Store(&[]registry.Instance{})
	return s
}

func (s *fakeSource) Instances() []registry.Instance {
	return append([]registry.Instance(nil), *s.insts.Load()...)
}
func (s *fakeSource) Ready() <-chan struct{}   { return s.ready }
func (s *fakeSource) Changed() <-chan struct{} { return *s.changed.Load() }

func (s *fakeSource) set(insts ...registry.Instance) {
	s.insts.Store(&insts)
	ch := make(chan struct{})
	old := s.changed.Swap(&ch)
	close(*old)
}

type fakeResolverCC struct {
	resolver.ClientConn
	states chan resolver.State
}

func (f *fakeResolverCC) UpdateState(s resolver.State) error {
	f.states <- s
	return nil
}

func ids(s resolver.State) string {
	var out []string
	for _, ep := range s.Endpoints {
		in, _ := instanceFromEndpoint(ep)
		out = append(out, in.ID+"@"+ep.Addresses[0].Addr)
	}
	return strings.Join(out, ",")
}

func TestResolverFollowsNotifications(t *testing.T) {
	e := routing.New()
	defer e.Close()
	svc := e.Service("orders")
	src := newFakeSource()
	cc := &fakeResolverCC{states: make(chan resolver.State, 10)}
	r := startResolver(cc, nil, svc, src, &serviceconfig.ParseResult{}, clientConfig([]ClientOption{withRefresh(time.Hour)}))
	defer r.Close()

	next := func() resolver.State {
		t.Helper()
		select {
		case s := <-cc.states:
			return s
		case <-time.After(30 * time.Second):
			t.Fatal("no resolver state")
		}
		return resolver.State{}
	}
	src.set(inst("b", "10.0.0.2:1", ""))
	close(src.ready)
	if s := next(); ids(s) != "b@10.0.0.2:1" || serviceFromState(s) != svc {
		t.Fatalf("first state %s", ids(s))
	}
	src.set(inst("b", "10.0.0.2:1", ""), inst("a", "10.0.0.1:1", "alice"))
	s := next()
	if ids(s) != "a@10.0.0.1:1,b@10.0.0.2:1" {
		t.Fatalf("second state %s", ids(s))
	}
	if in, ok := instanceFromEndpoint(s.Endpoints[0]); !ok || in.Lane != "alice" {
		t.Fatalf("instance attribute %+v", in)
	}
	r.ResolveNow(resolver.ResolveNowOptions{}) // pushes even when nothing changed
	if s := next(); ids(s) != "a@10.0.0.1:1,b@10.0.0.2:1" {
		t.Fatalf("state after ResolveNow %s", ids(s))
	}
}

func TestServiceConfigJSON(t *testing.T) {
	idem, err := parseMethods([]string{"/a.B/C", "/a.B/*", "/x.Y/Z"})
	if err != nil {
		t.Fatal(err)
	}
	got := serviceConfigJSON(LBConfig{Zone: "az1"}, idem, nil)
	want := `{"loadBalancingConfig":[{"lanes":{"zone":"az1"}}],"methodConfig":[{"name":[{"service":"a.B"},{"service":"x.Y","method":"Z"}],` +
		`"retryPolicy":{"maxAttempts":2,"initialBackoff":"0.01s","maxBackoff":"0.01s","backoffMultiplier":1,"retryableStatusCodes":["UNAVAILABLE"]}}],` +
		`"retryThrottling":{"maxTokens":100,"tokenRatio":0.1}}`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	health := ""
	if got := serviceConfigJSON(LBConfig{}, methodSet{}, &health); got != `{"loadBalancingConfig":[{"lanes":{}}],"healthCheckConfig":{"serviceName":""}}` {
		t.Fatalf("got %s", got)
	}
	for _, bad := range []string{"a.B/C", "/a.B", "/a.B/", "//C", "/a.B/C/D"} {
		if _, err := parseMethods([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
