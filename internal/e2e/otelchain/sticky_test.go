package otelchain

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/lanesdev/lanes/lanesgrpc"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// TestCanaryChoiceIsStickyAcrossHops: a and b split half of their baseline
// requests to a canary lane. A request without a request key enters a (the
// first lanes-aware service), which calls b twice over gRPC; b calls c over
// HTTP. a gives the request a key, which travels in baggage, so both calls
// to b, and b's call to c, make the same choice: every request is served by
// canaries alone or by baseline instances alone, and both happen.
func TestCanaryChoiceIsStickyAcrossHops(t *testing.T) {
	reg := registry.NewMemory()
	pol := policy.NewMemory()
	if _, err := pol.Put(context.Background(), []byte("canary:\n  - {service: b, lane: canary, percent: 50}\n  - {service: c, lane: canary, percent: 50}\n")); err != nil {
		t.Fatal(err)
	}
	e := routing.New(routing.WithRegistry(reg), routing.WithPolicyStore(pol), routing.WithLogger(quiet))
	t.Cleanup(func() {
		e.Close()
		reg.Close()
	})
	register := func(id, svc, addr, l string) {
		lease, err := reg.Register(context.Background(), registry.Instance{ID: id, Service: svc, Addr: addr, Lane: l}, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lease.Close() })
	}
	for _, l := range []string{"", "canary"} {
		id := "c-" + map[string]string{"": "base", "canary": "canary"}[l]
		s := httptest.NewServer(laneshttp.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, id)
		}), laneshttp.WithLogger(quiet)))
		t.Cleanup(s.Close)
		register(id, "c", s.Listener.Addr().String(), l)
	}
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	toC := laneshttp.NewClient(e, laneshttp.WithBase(base), laneshttp.WithEnv(noEnv))
	for _, l := range []string{"", "canary"} {
		id := "b-" + map[string]string{"": "base", "canary": "canary"}[l]
		gs := grpc.NewServer(lanesgrpc.ServerOptions(lanesgrpc.WithLogger(quiet))...)
		testpb.RegisterTestServiceServer(gs, &stickyB{id: id, c: toC})
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go gs.Serve(lis)
		t.Cleanup(gs.Stop)
		register(id, "b", lis.Addr().String(), l)
	}
	conn, err := lanesgrpc.NewClient(e, "b", lanesgrpc.WithLogger(quiet), lanesgrpc.WithEnv(noEnv),
		lanesgrpc.WithDialOptions(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	toB := testpb.NewTestServiceClient(conn)
	a := httptest.NewServer(laneshttp.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var got []string
		for range 2 { // for example, quote then ship
			res, err := toB.UnaryCall(r.Context(), &testpb.SimpleRequest{})
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			got = append(got, res.GetServerId())
		}
		io.WriteString(w, strings.Join(got, " "))
	}), laneshttp.WithLogger(quiet)))
	t.Cleanup(a.Close)
	for _, svc := range []string{"b", "c"} {
		waitInstances(t, e, svc, 2)
	}
	waitPolicy(t, e)

	plain := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(plain.CloseIdleConnections)
	seenBoth := map[string]bool{}
	for i := range 40 {
		res, err := plain.Get(a.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, res.StatusCode, body)
		}
		want := "b-base>c-base b-base>c-base"
		if strings.HasPrefix(string(body), "b-canary") {
			want = "b-canary>c-canary b-canary>c-canary"
		}
		if string(body) != want {
			t.Errorf("request %d took different choices on its hops: %s", i, body)
		}
		seenBoth[want] = true
	}
	if len(seenBoth) != 2 {
		t.Errorf("40 requests all made the same choice %v: no split happened", seenBoth)
	}
}

// waitPolicy waits until the engine has read its policy.
func waitPolicy(t *testing.T, e *routing.Engine) {
	t.Helper()
	select {
	case <-e.PolicyReady():
	case <-time.After(patience):
		t.Fatal("the engine did not read the policy")
	}
}

type stickyB struct {
	testpb.UnimplementedTestServiceServer
	id string
	c  *http.Client
}

func (s *stickyB) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://c/", nil)
	if err != nil {
		return nil, err
	}
	res, err := s.c.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	return &testpb.SimpleResponse{ServerId: fmt.Sprintf("%s>%s", s.id, body)}, nil
}
