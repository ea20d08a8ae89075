package otelchain

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesgrpc"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

func TestMain(m *testing.M) {
	// OpenTelemetry as its documentation sets it up: an SDK tracer provider
	// and the W3C trace-context and baggage propagators, globally.
	tp := sdktrace.NewTracerProvider()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { tp.Shutdown(context.Background()) }))
}

// patience bounds every wait on something asynchronous, for a loaded 2-core
// machine under -race.
const patience = 30 * time.Second

var quiet = slog.New(slog.DiscardHandler)

// order says which of lanes and OpenTelemetry wraps the other.
type order string

const (
	otelOutside  order = "otel-outside"  // otelhttp.NewHandler(laneshttp.Handler(h)), otelhttp.NewTransport(lanes transport)
	lanesOutside order = "lanes-outside" // laneshttp.Handler(otelhttp.NewHandler(h)), lanes transport over otelhttp.NewTransport
)

// serve wraps h in lanes' middleware and otelhttp's handler, in order o.
func serve(o order, name string, h http.Handler) http.Handler {
	if o == otelOutside {
		return otelhttp.NewHandler(laneshttp.Handler(h, laneshttp.WithLogger(quiet)), name)
	}
	return laneshttp.Handler(otelhttp.NewHandler(h, name), laneshttp.WithLogger(quiet))
}

// client returns an HTTP client that routes with e, with lanes' transport
// and otelhttp's in order o.
func client(t *testing.T, o order, e *routing.Engine) *http.Client {
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	if o == otelOutside {
		return &http.Client{Transport: otelhttp.NewTransport(laneshttp.NewTransport(e, laneshttp.WithBase(base), laneshttp.WithEnv(noEnv)))}
	}
	return laneshttp.NewClient(e, laneshttp.WithBase(otelhttp.NewTransport(base)), laneshttp.WithEnv(noEnv))
}

func noEnv(string) string { return "" }

// seen is what a hop reports about a request: its instance, its lane in
// lanes and in the OpenTelemetry baggage, and the baggage member team.
func seen(id string, ctx context.Context) string {
	b := baggage.FromContext(ctx)
	return fmt.Sprintf("%s[lane=%s otel=%s team=%s]", id, lane.FromContext(ctx), b.Member("lane").Value(), b.Member("team").Value())
}

// chain is a → b → c: a is an HTTP service, b a gRPC service with a baseline
// and an alice instance, c an HTTP service with a baseline and an alice
// instance. a and c are served with the order srv, b calls c with the
// transports in the order cli.
type chain struct {
	a string // the URL of a
}

func newChain(t *testing.T, srv, cli order) *chain {
	reg := registry.NewMemory()
	e := routing.New(routing.WithRegistry(reg), routing.WithLogger(quiet))
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

	// c: reports what it sees.
	for _, l := range []string{"", "alice"} {
		id := "c-" + map[string]string{"": "base", "alice": "alice"}[l]
		s := httptest.NewServer(serve(srv, "c", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, seen(id, r.Context()))
		})))
		t.Cleanup(s.Close)
		register(id, "c", s.Listener.Addr().String(), l)
	}

	// b: calls c over HTTP.
	toC := client(t, cli, e)
	for _, l := range []string{"", "alice"} {
		id := "b-" + map[string]string{"": "base", "alice": "alice"}[l]
		gs := grpc.NewServer(append([]grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler())},
			lanesgrpc.ServerOptions(lanesgrpc.WithLogger(quiet))...)...)
		testpb.RegisterTestServiceServer(gs, &bServer{id: id, c: toC})
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go gs.Serve(lis)
		t.Cleanup(gs.Stop)
		register(id, "b", lis.Addr().String(), l)
	}

	// a: calls b over gRPC, through lanes' client with otelgrpc's stats
	// handler.
	conn, err := lanesgrpc.NewClient(e, "b", lanesgrpc.WithLogger(quiet), lanesgrpc.WithEnv(noEnv), lanesgrpc.WithDialOptions(
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	toB := testpb.NewTestServiceClient(conn)
	a := httptest.NewServer(serve(srv, "a", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, err := toB.UnaryCall(r.Context(), &testpb.SimpleRequest{})
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		fmt.Fprintf(w, "%s > %s", seen("a", r.Context()), res.GetPayload().GetBody())
	})))
	t.Cleanup(a.Close)

	for _, svc := range []string{"b", "c"} {
		waitInstances(t, e, svc, 2)
	}
	return &chain{a: a.URL}
}

func waitInstances(t *testing.T, e *routing.Engine, svc string, n int) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		if got := len(e.Service(svc).Instances()); got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("service %s: the engine never saw %d instances", svc, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type bServer struct {
	testpb.UnimplementedTestServiceServer
	id string
	c  *http.Client
}

func (s *bServer) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
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
	return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: fmt.Appendf(nil, "%s > %s", seen(s.id, ctx), body)}}, nil
}

// TestOneLaneOnEveryHop sends requests that disagree with themselves (an
// invalid x-lane next to a valid baggage lane, x-lane and baggage naming
// different lanes) through a → b → c from a caller that knows only
// OpenTelemetry, for every order of lanes' and OpenTelemetry's handlers and
// transports. Every hop must serve, carry and see the lane that a decided:
// in lanes, in the OpenTelemetry baggage of its context, and in the
// instance that serves it; the other baggage members travel on.
func TestOneLaneOnEveryHop(t *testing.T) {
	caller := &http.Client{Transport: otelhttp.NewTransport(http.DefaultTransport)}
	t.Cleanup(caller.CloseIdleConnections)
	cases := []struct {
		name    string
		xlane   string   // "" for none
		baggage []string // the caller's OpenTelemetry baggage, key-value pairs
		lane    string   // the lane a decides
	}{
		{"invalid x-lane, baggage alice", "al ice", []string{"lane", "alice", "team", "x"}, ""},
		{"invalid x-lane, baggage alice alone", "-alice", []string{"lane", "alice"}, ""},
		{"x-lane alice, baggage bob", "alice", []string{"lane", "bob", "team", "x"}, "alice"},
		{"x-lane baseline-blank, baggage alice", " ", []string{"lane", "alice", "team", "x"}, "alice"},
		{"baggage alice", "", []string{"lane", "alice", "team", "x"}, "alice"},
		{"x-lane alice, baggage without lane", "alice", []string{"team", "x"}, "alice"},
		{"x-lane alice, no baggage", "alice", nil, "alice"},
		{"no lane", "", []string{"team", "x"}, ""},
	}
	for _, srv := range []order{otelOutside, lanesOutside} {
		for _, cli := range []order{otelOutside, lanesOutside} {
			t.Run(fmt.Sprintf("servers %s, client %s", srv, cli), func(t *testing.T) {
				ch := newChain(t, srv, cli)
				for _, tc := range cases {
					ctx := context.Background()
					if tc.baggage != nil {
						ctx = withBaggage(t, ctx, tc.baggage...)
					}
					team := ""
					for i := 0; i+1 < len(tc.baggage); i += 2 {
						if tc.baggage[i] == "team" {
							team = tc.baggage[i+1]
						}
					}
					inst := "base"
					if tc.lane != "" {
						inst = tc.lane
					}
					hop := func(id string) string {
						return fmt.Sprintf("%s[lane=%s otel=%s team=%s]", id, tc.lane, tc.lane, team)
					}
					want := hop("a") + " > " + hop("b-"+inst) + " > " + hop("c-"+inst)

					req, err := http.NewRequestWithContext(ctx, http.MethodGet, ch.a+"/", nil)
					if err != nil {
						t.Fatal(err)
					}
					if tc.xlane != "" {
						req.Header.Set("X-Lane", tc.xlane)
					}
					res, err := caller.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					body, _ := io.ReadAll(res.Body)
					res.Body.Close()
					if got := strings.TrimSpace(string(body)); res.StatusCode != 200 || got != want {
						t.Errorf("%s: %d\n got %s\nwant %s", tc.name, res.StatusCode, got, want)
					}
				}
			})
		}
	}
}

// withBaggage returns ctx with OpenTelemetry baggage of the key-value pairs.
func withBaggage(t *testing.T, ctx context.Context, kv ...string) context.Context {
	var ms []baggage.Member
	for i := 0; i+1 < len(kv); i += 2 {
		m, err := baggage.NewMember(kv[i], kv[i+1])
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	b, err := baggage.New(ms...)
	if err != nil {
		t.Fatal(err)
	}
	return baggage.ContextWithBaggage(ctx, b)
}
