package integrity

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesgrpc"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/registry"
)

// The chain of the end-to-end mesh test, traced: entry → A (HTTP) → B (gRPC unary, which hands
// the call to C to a goroutine through lane.Detach) → C (HTTP) → D (gRPC server stream). B and D
// have feature-x instances, C feature-x and alice ones.

// grpcInstance serves impl as an instance of service in lane l, traced and guarded, and
// registers it.
func (w *world) grpcInstance(service, id, l string, impl testgrpc.TestServiceServer) {
	w.t.Helper()
	tp := w.provider(service)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		w.t.Fatal(err)
	}
	inst := registry.Instance{Service: service, ID: id, Lane: l, Addr: lis.Addr().String()}
	g := lanesgrpc.NewGuard(w.engine)
	g.SetInstance(inst)
	srv := lanesgrpc.NewServer(lanesgrpc.WithGuard(g), lanesgrpc.WithTracerProvider(tp))
	testgrpc.RegisterTestServiceServer(srv, impl)
	go srv.Serve(lis)
	w.t.Cleanup(srv.Stop)
	w.register(inst)
}

// grpcClient is a traced lanes client of service, made by caller.
func (w *world) grpcClient(caller, service string) testgrpc.TestServiceClient {
	w.t.Helper()
	cc, err := lanesgrpc.NewClient(w.engine, service, lanesgrpc.WithTracerProvider(w.provider(caller)),
		lanesgrpc.WithEnv(noEnv), lanesgrpc.WithDialOptions(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { cc.Close() })
	return testgrpc.NewTestServiceClient(cc)
}

// serviceB answers UnaryCall with the answer of C, which a goroutine detached from the call asks.
type serviceB struct {
	testgrpc.UnimplementedTestServiceServer
	id string
	c  *http.Client
}

func (s *serviceB) UnaryCall(ctx context.Context, _ *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	type answer struct {
		body string
		err  error
	}
	done := make(chan answer, 1)
	go func(ctx context.Context) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://c/", nil)
		res, err := s.c.Do(req)
		if err != nil {
			done <- answer{err: err}
			return
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		done <- answer{body: string(b)}
	}(lane.Detach(ctx))
	a := <-done
	if a.err != nil {
		return nil, a.err
	}
	return &testgrpc.SimpleResponse{Username: s.id + " " + a.body}, nil
}

// serviceD answers a server stream with its id.
type serviceD struct {
	testgrpc.UnimplementedTestServiceServer
	id string
}

func (s *serviceD) StreamingOutputCall(_ *testgrpc.StreamingOutputCallRequest, stream grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	return stream.Send(&testgrpc.StreamingOutputCallResponse{Payload: &testgrpc.Payload{Body: []byte(s.id)}})
}

func TestChainTraced(t *testing.T) {
	w := newWorld(t)
	toB := w.grpcClient("a", "b")
	w.instance("a", "a-1", "", func(*http.Client) http.HandlerFunc {
		return func(rw http.ResponseWriter, r *http.Request) {
			res, err := toB.UnaryCall(r.Context(), &testgrpc.SimpleRequest{})
			if err != nil {
				http.Error(rw, err.Error(), http.StatusBadGateway)
				return
			}
			fmt.Fprintf(rw, "a-1 %s", res.GetUsername())
		}
	})
	bClient := laneshttp.NewClient(w.engine, laneshttp.WithTracerProvider(w.provider("b")), laneshttp.WithEnv(noEnv))
	t.Cleanup(bClient.CloseIdleConnections)
	for _, in := range [][2]string{{"b-1", ""}, {"b-fx", "feature-x"}} {
		w.grpcInstance("b", in[0], in[1], &serviceB{id: in[0], c: bClient})
	}
	toD := w.grpcClient("c", "d")
	for _, in := range [][2]string{{"c-1", ""}, {"c-fx", "feature-x"}, {"c-alice", "alice"}} {
		id := in[0]
		w.instance("c", id, in[1], func(*http.Client) http.HandlerFunc {
			return func(rw http.ResponseWriter, r *http.Request) {
				st, err := toD.StreamingOutputCall(r.Context(), &testgrpc.StreamingOutputCallRequest{})
				if err == nil {
					var m *testgrpc.StreamingOutputCallResponse
					if m, err = st.Recv(); err == nil {
						fmt.Fprintf(rw, "%s %s", id, m.GetPayload().GetBody())
						return
					}
				}
				http.Error(rw, err.Error(), http.StatusBadGateway)
			}
		})
	}
	for _, in := range [][2]string{{"d-1", ""}, {"d-fx", "feature-x"}} {
		w.grpcInstance("d", in[0], in[1], &serviceD{id: in[0]})
	}

	for _, tc := range []struct{ lane, path string }{
		{"", "a-1 b-1 c-1 d-1"},
		{"feature-x", "a-1 b-fx c-fx d-fx"},
		{"alice", "a-1 b-1 c-alice d-1"},
	} {
		body, id := w.enter("a", tc.lane)
		if body != tc.path {
			t.Fatalf("lane %q: answer %q, want %q", tc.lane, body, tc.path)
		}
		// The client spans, depth first, name the instance of each hop, in one trace.
		var tr adminapi.Trace
		deadline := time.Now().Add(patience)
		for {
			var ok bool
			if tr, ok = w.col.Trace(id); ok && len(tr.Hops) >= 9 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("lane %q: trace %s has %d hops, want 9: %+v", tc.lane, id, len(tr.Hops), tr.Hops)
			}
			time.Sleep(10 * time.Millisecond)
		}
		var calls, lanes []string
		depth := -1
		for _, h := range tr.Hops {
			if h.Depth <= depth {
				t.Errorf("lane %q: the hops are not one path: %+v", tc.lane, tr.Hops)
			}
			depth = h.Depth
			if h.Kind == "client" {
				calls = append(calls, h.Instance)
			}
			lanes = append(lanes, h.Requested)
		}
		if got := strings.Join(calls, " "); got != tc.path {
			t.Errorf("lane %q: the trace's calls went to %q, want %q", tc.lane, got, tc.path)
		}
		for i, l := range lanes {
			if l != tc.lane {
				t.Errorf("lane %q: hop %d (%s %s) carries lane %q", tc.lane, i, tr.Hops[i].Service, tr.Hops[i].Kind, l)
			}
		}
	}
	if fs := w.col.Findings(time.Time{}, ""); len(fs) != 0 {
		t.Fatalf("findings on the chain: %+v", fs)
	}
}
