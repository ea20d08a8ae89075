package polyglot

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/lanesdev/lanes/internal/testkit/childproc"
)

// stack is `lanes up` with the example's services joined to it.
type stack struct {
	t              *testing.T
	dir, modules   string
	gateway, admin string
	token          string
	registry       []string // the environment a lanes process joins with
	otel           []string // the environment of an OpenTelemetry SDK sending to lanes
	bootstrap      string   // the xDS bootstrap file of the proxyless clients
	up             *childproc.Child
}

var (
	upAddr        = regexp.MustCompile(`(?m)^(etcd|traces|gateway|xds|admin)\s+(?:https?://|grpc://)?(\S+)`)
	otlpHTTP      = regexp.MustCompile(`OTLP/HTTP on (\S+?);`)
	listening     = regexp.MustCompile(`listening on (127\.0\.0\.1:\d+)`)
	registered    = regexp.MustCompile(`(?m)^sidecar: registered .* at (\S+)$`)
	outboundProxy = regexp.MustCompile(`sidecar: outbound proxy (127\.0\.0\.1:\d+)`)
)

// startStack starts `lanes up` with the xDS server and a route / to web.
func startStack(t *testing.T, modules string) *stack {
	t.Helper()
	s := &stack{t: t, dir: t.TempDir(), modules: modules}
	s.up = start(t, "lanes up", nil, nil, bins.lanes, "up", "--data-dir", filepath.Join(s.dir, "lanes"),
		"--admin-addr", "127.0.0.1:0", "--gateway-addr", "127.0.0.1:0", "--etcd-client-addr", "127.0.0.1:0",
		"--etcd-peer-addr", "127.0.0.1:0", "--nats-addr", "127.0.0.1:0", "--otlp-grpc-addr", "127.0.0.1:0",
		"--otlp-http-addr", "127.0.0.1:0", "--xds-addr", "127.0.0.1:0", "--route", "/=web", "--log-level", "warn")
	s.up.WaitMatch(regexp.MustCompile(`lanes is up\.`))
	out := s.up.Stdout.String()
	addr := map[string]string{}
	for _, m := range upAddr.FindAllStringSubmatch(out, -1) {
		addr[m[1]] = m[2]
	}
	m := otlpHTTP.FindStringSubmatch(out)
	if m == nil || len(addr) != 5 {
		t.Fatalf("lanes up: addresses missing from its output:\n%s", out)
	}
	s.gateway, s.admin = "http://"+addr["gateway"], "http://"+addr["admin"]
	data := filepath.Join(s.dir, "lanes")
	s.token = readToken(t, filepath.Join(data, "admin-token"))
	telemetry := readToken(t, filepath.Join(data, "telemetry-token"))
	s.registry = []string{
		"LANES_REGISTRY=etcd://" + addr["etcd"], "LANES_ETCD_USERNAME=root",
		"LANES_ETCD_PASSWORD_FILE=" + filepath.Join(data, "etcd-password"),
		"LANES_TRACES=" + addr["traces"], "LANES_TRACES_TOKEN=" + telemetry,
	}
	s.otel = []string{
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://" + m[1] + "/v1/traces",
		"OTEL_EXPORTER_OTLP_TRACES_HEADERS=authorization=Bearer%20" + telemetry,
		"OTEL_METRICS_EXPORTER=none", "OTEL_LOGS_EXPORTER=none",
	}
	s.bootstrap = filepath.Join(s.dir, "xds-bootstrap.json")
	b, err := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{"server_uri": addr["xds"], "channel_creds": []any{map[string]string{"type": "insecure"}},
			"server_features": []string{"xds_v3"}}},
		"node": map[string]any{"id": "polyglot-test", "locality": map[string]string{}},
	})
	if err == nil {
		err = os.WriteFile(s.bootstrap, b, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func readToken(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// instance is one instance of a service: its app and, for the Node and Python services, its sidecar.
type instance struct {
	service, lane string
	app, sidecar  *childproc.Child
	addr          string // the address registered
}

func (i *instance) String() string { return i.service + "@" + name(i.lane) }

// env is the environment of an app: its lane (the example's services report it), and more.
func laneEnv(l string, more ...string) []string {
	return append([]string{"LANES_LANE=" + l}, more...)
}

// sidecar starts `lanes sidecar` for the app at app and waits until it registered.
func (s *stack) sidecar(i *instance, app string, args ...string) {
	s.t.Helper()
	argv := []string{bins.lanes, "sidecar", "--service", i.service, "--app", app}
	if i.lane != "" {
		argv = append(argv, "--lane", i.lane)
	}
	i.sidecar = start(s.t, i.String()+" sidecar", s.registry, nil, append(argv, args...)...)
}

// waitRegistered waits for the sidecar's "registered" line.
func (s *stack) waitRegistered(i *instance) {
	s.t.Helper()
	i.addr = i.sidecar.WaitMatch(registered)[1]
}

// ledger starts the Go service; it registers itself (lanesgrpc.Serve).
func (s *stack) ledger(l string) *instance {
	s.t.Helper()
	i := &instance{service: "ledger", lane: l}
	i.app = start(s.t, i.String(), append(s.registry, laneEnv(l)...), nil, bins.ledger)
	return i
}

// payments starts the Node gRPC service and its sidecar --direct.
func (s *stack) payments(l string) *instance {
	s.t.Helper()
	i := &instance{service: "payments", lane: l}
	env := append(laneEnv(l, "NODE_PATH="+s.modules, "PORT=0", "OTEL_SERVICE_NAME=payments", "GRPC_XDS_BOOTSTRAP="+s.bootstrap), s.otel...)
	i.app = start(s.t, i.String(), env, nil, "node", "--require", filepath.Join(example(s.t), "otel.js"),
		filepath.Join(example(s.t), "payments", "payments.js"))
	s.sidecar(i, i.app.WaitMatch(listening)[1], "--direct")
	return i
}

// orders starts the Python service and its sidecar.
func (s *stack) orders(l string) *instance {
	s.t.Helper()
	i := &instance{service: "orders", lane: l}
	env := laneEnv(l, "PORT=0", "GRPC_XDS_BOOTSTRAP="+s.bootstrap, "PYTHONUNBUFFERED=1")
	i.app = start(s.t, i.String(), env, nil, python, filepath.Join(example(s.t), "orders", "orders.py"))
	s.sidecar(i, i.app.WaitMatch(listening)[1], "--listen", "127.0.0.1:0", "--ready-path", "/healthz")
	return i
}

// web starts the Node HTTP service behind its sidecar. The sidecar starts first, at the address of
// a listener that web is handed (its outbound proxy is web's HTTP_PROXY); it registers once web
// answers its ready path.
func (s *stack) web(l string) *instance {
	s.t.Helper()
	i := &instance{service: "web", lane: l}
	app, lis := listen(s.t)
	s.sidecar(i, app, "--listen", "127.0.0.1:0", "--proxy", "127.0.0.1:0", "--ready-path", "/healthz")
	proxy := i.sidecar.WaitMatch(outboundProxy)[1]
	env := append(laneEnv(l, "NODE_PATH="+s.modules, "LISTEN_FD=3", "HTTP_PROXY=http://"+proxy, "OTEL_SERVICE_NAME=web"), s.otel...)
	i.app = start(s.t, i.String(), env, []*os.File{lis}, "node", "--require", filepath.Join(example(s.t), "otel.js"),
		filepath.Join(example(s.t), "web", "web.js"))
	lis.Close() // web holds it now
	return i
}

// fleet starts the example's four services, each with a baseline instance, orders and payments
// with one in lane alice, web and ledger with one in lane bob, and waits until every sidecar
// registered its instance.
func (s *stack) fleet() map[string]*instance {
	s.t.Helper()
	all := []*instance{
		s.ledger(""), s.ledger("bob"),
		s.payments(""), s.payments("alice"),
		s.orders(""), s.orders("alice"),
		s.web(""), s.web("bob"),
	}
	m := map[string]*instance{}
	for _, i := range all {
		if i.sidecar != nil {
			s.waitRegistered(i)
		}
		m[i.String()] = i
	}
	return m
}

// expected is the chain a request in lane l is served by, by routing.md: each hop in l where the
// service has an instance in l, else on the baseline; the lane carried at every hop.
func expected(l string) []hop {
	in := map[string]map[string]bool{"web": {"bob": true}, "orders": {"alice": true}, "payments": {"alice": true}, "ledger": {"bob": true}}
	var out []hop
	for _, svc := range []string{"web", "orders", "payments", "ledger"} {
		h := hop{Service: svc, Request: l}
		if in[svc][l] {
			h.Lane = l
		}
		out = append(out, h)
	}
	return out
}

func chain(hops []hop) string {
	parts := make([]string, len(hops))
	for i, h := range hops {
		parts[i] = h.String()
	}
	return strings.Join(parts, " -> ")
}

func sameChain(a, b []hop) bool { return fmt.Sprint(a) == fmt.Sprint(b) }
