package tunnel

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesenv"
	"github.com/lanesdev/lanes/lanesgrpc"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/lanesnats"
	"github.com/lanesdev/lanes/registry"
)

// The programs of the test, run as children of the test binary in the
// namespaces (the variable roleEnv names the role).
const roleEnv = "LANES_TUNNEL_E2E_ROLE"

// The lane of the test, the topic and the laptop's address (in a namespace
// of the test's own, where nothing else listens).
const (
	testLane   = "alice"
	topic      = "events"
	laptopAddr = "127.0.0.1:9000"
)

// answer is what web answers: who served it, in which lane, and what its
// calls to orders (HTTP) and greeter (gRPC) reached.
type answer struct {
	By      string   `json:"by"`
	Lane    string   `json:"lane"`
	Orders  string   `json:"orders,omitempty"`
	Greeter string   `json:"greeter,omitempty"`
	Proxied string   `json:"proxied,omitempty"` // orders, called without the SDK through lanes dev's proxy
	Handled []string `json:"handled,omitempty"`
	Err     string   `json:"err,omitempty"`
}

func runRole(role string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch role {
	case "env":
		err = envRole(ctx)
	case "laptop":
		err = laptopRole(ctx)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, role+":", err)
		return 1
	}
	return 0
}

// handled keeps the messages a consumer handled.
type handled struct {
	mu   sync.Mutex
	msgs []string
}

func (h *handled) add(s string) {
	h.mu.Lock()
	h.msgs = append(h.msgs, s)
	h.mu.Unlock()
}

func (h *handled) list() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.msgs)
}

func writeAnswer(w http.ResponseWriter, a answer) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(a)
}

// servedBy puts the server's name in a header of every gRPC answer.
func servedBy(name string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		grpc.SetHeader(ctx, metadata.Pairs("served-by", name))
		return h(ctx, req)
	}
}

// envRole runs the environment's services on the environment's loopback:
// web and orders (HTTP) in the baseline, greeter (gRPC) in the baseline and
// in the lane, and web's baseline NATS consumer. web's /publish publishes a
// message in a lane.
func envRole(ctx context.Context) error {
	env, err := lanesenv.Open(ctx)
	if err != nil {
		return err
	}
	defer env.Close()
	if err := env.NATS.CreateStreams(ctx, topic); err != nil {
		return err
	}
	pub, err := env.NATS.Publisher(topic)
	if err != nil {
		return err
	}
	var got handled
	cons, err := env.NATS.Consumer(ctx, lanesnats.ConsumerConfig{Service: "web", Group: "events", Topic: topic,
		Registry: env.Registry, Engine: env.Engine, Instance: registry.Instance{ID: "env-consumer", Addr: "127.0.0.1:1"}},
		lanesnats.HandlerFunc(func(ctx context.Context, d *lanesnats.Delivery) error {
			got.add(string(d.Data))
			return nil
		}))
	if err != nil {
		return err
	}
	defer cons.Close()

	errs := make(chan error, 8)
	serveHTTP := func(service, id, l string, h http.Handler) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			errs <- err
			return
		}
		go func() {
			errs <- laneshttp.Serve(ctx, &http.Server{Handler: h}, ln, env.Registry,
				registry.Instance{Service: service, ID: id, Lane: l, Addr: ln.Addr().String()}, laneshttp.WithDrainDelay(-1))
		}()
	}
	web := http.NewServeMux()
	web.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeAnswer(w, answer{By: "env-web", Lane: lane.FromContext(r.Context())})
	})
	web.HandleFunc("/handled", func(w http.ResponseWriter, r *http.Request) {
		writeAnswer(w, answer{By: "env-web", Handled: got.list()})
	})
	web.HandleFunc("/publish", func(w http.ResponseWriter, r *http.Request) {
		ctx := lane.WithLane(r.Context(), r.URL.Query().Get("lane"))
		_, err := pub.Publish(ctx, "created", []byte(r.URL.Query().Get("msg")))
		a := answer{By: "env-web"}
		if err != nil {
			a.Err = err.Error()
		}
		writeAnswer(w, a)
	})
	serveHTTP("web", "env-web", "", web)
	serveHTTP("orders", "env-orders", "", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "env-orders@"+lane.FromContext(r.Context()))
	}))
	for _, l := range []string{"", testLane} {
		name := "env-greeter@" + l
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		srv := lanesgrpc.NewServer(lanesgrpc.WithServerOptions(grpc.ChainUnaryInterceptor(servedBy(name))))
		healthpb.RegisterHealthServer(srv, health.NewServer())
		go func() {
			errs <- lanesgrpc.Serve(ctx, srv, ln, env.Registry, registry.Instance{Service: "greeter", ID: "env-greeter-" + l, Lane: l, Addr: ln.Addr().String()})
		}()
	}
	fmt.Println("ready")
	select {
	case err := <-errs:
		return err
	case <-ctx.Done():
		return nil
	}
}

// laptopRole is the service on the laptop, run by `lanes dev -- ...`: web
// in the lane, on the laptop's loopback. Its calls go through the SDK,
// which dials through the tunnel (LANES_DIAL); its NATS consumer reaches
// NATS through the tunnel (LANES_NATS). It registers nothing itself but
// its consumer: lanes dev registered web.
func laptopRole(ctx context.Context) error {
	env, err := lanesenv.Open(ctx)
	if err != nil {
		return err
	}
	defer env.Close()
	hc := laneshttp.NewClient(env.Engine)
	px, err := url.Parse(os.Getenv("LANES_DIAL"))
	if err != nil {
		return err
	}
	plainTr := &http.Transport{Proxy: http.ProxyURL(px)}
	plain := &http.Client{Transport: plainTr} //lanes:ignore a program without the SDK, through lanes dev's proxy
	defer plainTr.CloseIdleConnections()
	gc, err := lanesgrpc.NewClient(env.Engine, "greeter", lanesgrpc.WithDialOptions(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		return err
	}
	defer gc.Close()
	hcli := healthpb.NewHealthClient(gc)
	var got handled
	cons, err := env.NATS.Consumer(ctx, lanesnats.ConsumerConfig{Service: "web", Group: "events", Topic: topic,
		Registry: env.Registry, Engine: env.Engine, Instance: registry.Instance{ID: "laptop-consumer", Lane: testLane, Addr: laptopAddr}},
		lanesnats.HandlerFunc(func(ctx context.Context, d *lanesnats.Delivery) error {
			got.add(string(d.Data))
			return nil
		}))
	if err != nil {
		return err
	}
	defer cons.Close()

	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		a := answer{By: "laptop", Lane: lane.FromContext(r.Context())}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://orders/", nil)
		if res, err := hc.Do(req); err != nil {
			a.Err = "orders: " + err.Error()
		} else {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			a.Orders = string(b)
		}
		preq, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://orders/", nil)
		preq.Header.Set("X-Lane", lane.FromContext(r.Context()))
		if res, err := plain.Do(preq); err != nil {
			a.Err += " orders through the proxy: " + err.Error()
		} else {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			a.Proxied = string(b)
		}
		var md metadata.MD
		if _, err := hcli.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md)); err != nil {
			a.Err += " greeter: " + err.Error()
		} else if v := md.Get("served-by"); len(v) > 0 {
			a.Greeter = v[0]
		}
		writeAnswer(w, a)
	})
	mux.HandleFunc("/handled", func(w http.ResponseWriter, r *http.Request) {
		writeAnswer(w, answer{By: "laptop", Handled: got.list()})
	})
	ln, err := net.Listen("tcp", laptopAddr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: laneshttp.Handler(mux), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	fmt.Println("laptop serving")
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}
