package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/app/gateway"
	"github.com/lanesdev/lanes/internal/lib/strictyaml"
	"github.com/lanesdev/lanes/internal/testkit/leaktest"
	"github.com/lanesdev/lanes/internal/testkit/natstest"
)

func TestMain(m *testing.M) {
	natstest.RunChild()
	goleak.VerifyTestMain(m, leaktest.Options()...)
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// Precedence: flags over environment over file over defaults.
func TestConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "lanes.yaml")
	os.WriteFile(file, []byte("admin_addr: 127.0.0.1:1001\ngateway_addr: 127.0.0.1:1002\ndomain: file.test\nroutes: [/=web]\netcd:\n  prefix: /file/\n"), 0o644)
	c := Defaults()
	if err := c.LoadFile(file); err != nil {
		t.Fatal(err)
	}
	if err := c.ApplyEnv(env(map[string]string{"LANES_GATEWAY_ADDR": "127.0.0.1:2002", "LANES_DOMAIN": "env.test", "LANES_ROUTES": "/a=orders, /=web"})); err != nil {
		t.Fatal(err)
	}
	if err := c.Set("domain", []string{"flag.test"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"admin":   "127.0.0.1:1001", // file
		"gateway": "127.0.0.1:2002", // env over file
		"domain":  "flag.test",      // flag over env over file
		"prefix":  "/file/",
		"data":    ".lanes", // default
	}
	got := map[string]string{"admin": c.AdminAddr, "gateway": c.GatewayAddr, "domain": c.Domain, "prefix": c.Etcd.Prefix, "data": c.DataDir}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	gc, err := c.GatewayConfig()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gc.Routes, []adminapi.Route{{Prefix: "/a", Service: "orders"}, {Prefix: "/", Service: "web"}}) {
		t.Errorf("routes %+v", gc.Routes)
	}
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "lanes.yaml")
	for _, tc := range []struct {
		doc, want string
	}{
		{"admin_addr: 1\nbogus: 2\n", file + ":2: field bogus: unknown field"},
		{"etcd:\n  endpoints: nope\n", file + ":2: field etcd.endpoints"},
		{"admin_addr: nope\n", file + ":1: field admin_addr: \"nope\": want host:port"},
		{"trusted_proxies: [10.0.0.0/8, x]\n", "trusted_proxies"},
		{"etcd:\n  ca: ca.pem\n", file + ":2: field etcd.ca: \"ca.pem\": only for an external etcd"},
		{"etcd:\n  endpoints: [\"127.0.0.1:2379\"]\n  username: u\n", "set both the etcd username and password"},
		{"traces:\n  receiver_auth: anyone\n", `traces.receiver_auth: "anyone": want token, loopback or open`},
		{"traces:\n  token: short\n", "traces.token: \"(hidden)\": the telemetry token must be at least 16 characters"},
		{"traces:\n  max_value_bytes: 8\n", `traces.max_value_bytes: "8": want a whole number of bytes, 64 or more`},
		{"traces:\n  max_check_mib: 0\n", `traces.max_check_mib: "0": want a whole number of MiB, 1 or more`},
		{"xds:\n  addr: 0.0.0.0:0\n", `xds.addr: "0.0.0.0:0": with xds.auth loopback the xDS server listens on a loopback address only`},
		{"xds:\n  addr: 127.0.0.1:0\n  auth: nobody\n", `xds.auth: "nobody": want loopback or token`},
		{"xds:\n  addr: nope\n", `xds.addr: "nope": want host:port (or off)`},
		// This package does not link kubestore, as the lanes binary does.
		{"kube:\n  enabled: true\n", file + `:2: field kube.enabled: "true": this program does not link the Kubernetes registry`},
	} {
		os.WriteFile(file, []byte(tc.doc), 0o644)
		c := Defaults()
		err := c.LoadFile(file)
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.doc, err, tc.want)
		}
	}
	c := Defaults()
	err := c.ApplyEnv(env(map[string]string{"LANES_ETCD_DIAL_TIMEOUT": "soon"}))
	var se *SettingError
	if !errors.As(err, &se) || se.Source != "LANES_ETCD_DIAL_TIMEOUT" {
		t.Errorf("bad variable: %v", err)
	}
	c = Defaults()
	c.Set("route", []string{"/=web,bad route"})
	if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), "--route") {
		t.Errorf("bad flag: %v", err)
	}
	var ye *strictyaml.Error
	os.WriteFile(file, []byte("admin_addr: [1\n"), 0o644)
	c = Defaults()
	if err := c.LoadFile(file); !errors.As(err, &ye) || ye.File != file {
		t.Errorf("syntax error: %v", err)
	}
}

func TestParseRoute(t *testing.T) {
	for in, want := range map[string]adminapi.Route{
		"/=web":                       {Prefix: "/", Service: "web"},
		"/api/v1=orders":              {Prefix: "/api/v1", Service: "orders"},
		"shop.example.com=web":        {Host: "shop.example.com", Service: "web"},
		"shop.example.com/api=orders": {Host: "shop.example.com", Prefix: "/api", Service: "orders"},
	} {
		got, err := ParseRoute(in)
		if err != nil || got != want {
			t.Errorf("%q: %+v %v", in, got, err)
		}
	}
	// ParseRoute reads the syntax; the gateway's validation the parts.
	for _, bad := range []string{"web", "=web", "/=", "/=a/b", "host:80=web", ".x=web", "/%zz=web"} {
		c := Defaults()
		if err := c.Set("route", []string{bad}); err != nil {
			t.Fatal(err)
		}
		err := c.Validate()
		var se *SettingError
		if !errors.As(err, &se) || se.Source != "--route" || se.Value != bad {
			t.Errorf("%q: %v, want a SettingError naming --route and the route", bad, err)
		}
	}
}

// TestRouteConflicts checks that routes the gateway would refuse are
// refused by Validate, before anything starts, naming the route as given
// and the one before it that shadows it.
func TestRouteConflicts(t *testing.T) {
	for _, c := range []struct {
		routes []string
		value  string // the route named
		msg    string // in the message
	}{
		{[]string{"/=web", "/=web"}, "/=web", `route "/=web" before it (--route) has the same host and path prefix`},
		{[]string{"/a=web", "/a/=web"}, "/a/=web", `route "/a=web" before it`},
		{[]string{"/b=web", "x.example.com/b=web", "/b/=orders"}, "/b/=orders", `route "/b=web" before it`},
		{[]string{"/a%zz=web"}, "/a%zz=web", `not percent-encoded`},
		{[]string{"/a%2Fb=web"}, "/a%2Fb=web", `not percent-encoded`},
	} {
		cfg := Defaults()
		cfg.Set("route", c.routes)
		err := cfg.Validate()
		var se *SettingError
		if !errors.As(err, &se) || se.Source != "--route" || se.Value != c.value || !strings.Contains(se.Msg, c.msg) {
			t.Errorf("%q: %v, want --route %q and %q", c.routes, err, c.value, c.msg)
		}
	}
	// Start refuses them before anything starts: no etcd data appears.
	cfg := Defaults()
	cfg.DataDir = t.TempDir()
	cfg.Set("route", []string{"/a=web", "/a/=web"})
	if _, err := Start(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), `"/a/=web"`) {
		t.Errorf("Start: %v", err)
	}
	if entries, _ := os.ReadDir(cfg.DataDir); len(entries) != 0 {
		t.Errorf("Start made %v in the data directory before refusing the routes", entries)
	}

	// From a file: the file, the line and the field of the route.
	file := filepath.Join(t.TempDir(), "lanes.yaml")
	os.WriteFile(file, []byte("routes:\n  - /=web\n  - /=orders\n"), 0o644)
	cfg = Defaults()
	if err := cfg.LoadFile(file); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), file+":3: field routes[1]: \"/=orders\": route \"/=web\" before it ("+file+":2: field routes[0])") {
		t.Errorf("from a file: %v", err)
	}
}

// TestGatewaySettings checks that every gateway setting reaches the
// gateway's configuration, from flags, variables and the file alike.
func TestGatewaySettings(t *testing.T) {
	file := filepath.Join(t.TempDir(), "lanes.yaml")
	os.WriteFile(file, []byte(`routes: [/api=orders, /=web]
gateway:
  aliases: [x-tag]
  lane_cookie: mylane
  key_header: x-user
  disable: [cookie, host]
  strip_prefixes: [/api]
  preserve_host: true
  max_idle_conns_per_host: 7
  ready_timeout: 3s
  upstream_read_timeout: 2m
  client_write_timeout: 90s
  upstream_idle_timeout: 30s
  client_header_timeout: 5s
  http1: std
`), 0o644)
	c := Defaults()
	if err := c.LoadFile(file); err != nil {
		t.Fatal(err)
	}
	if err := c.ApplyEnv(env(map[string]string{"LANES_GATEWAY_KEY_COOKIE": "uid", "LANES_GATEWAY_RESPONSE_HEADER_TIMEOUT": "off", "LANES_GATEWAY_UPSTREAM_WRITE_TIMEOUT": "30s"})); err != nil {
		t.Fatal(err)
	}
	if err := c.Set("gateway-ready-timeout", []string{"4s"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Set("gateway-client-idle-timeout", []string{"75s"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Set("gateway-max-conns", []string{"300"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	gc, err := c.GatewayConfig()
	if err != nil {
		t.Fatal(err)
	}
	want := gateway.Config{
		Routes:     []adminapi.Route{{Prefix: "/api", StripPrefix: true, Service: "orders"}, {Prefix: "/", Service: "web"}},
		Domain:     "lanes.localhost",
		Aliases:    []string{"x-tag"},
		LaneCookie: "mylane", KeyHeader: "x-user", KeyCookie: "uid",
		Disable:      []gateway.Source{gateway.SourceCookie, gateway.SourceHost},
		PreserveHost: true, MaxIdleConnsPerHost: 7, ReadyTimeout: 4 * time.Second, ResponseHeaderTimeout: -1,
		UpstreamWriteTimeout: 30 * time.Second, UpstreamReadTimeout: 2 * time.Minute,
		ClientWriteTimeout: 90 * time.Second, HTTP1: gateway.HTTP1Std,
		UpstreamIdleTimeout: 30 * time.Second, ClientIdleTimeout: 75 * time.Second,
		ClientHeaderTimeout: 5 * time.Second, MaxConns: 300,
	}
	if !reflect.DeepEqual(gc, want) {
		t.Errorf("gateway config\n got %+v\nwant %+v", gc, want)
	}

	for _, tc := range []struct {
		flag string
		vals []string
		want string
	}{
		{"gateway-disable", []string{"cookie", "headers"}, `--gateway-disable: "headers": unknown source "headers": want header, baggage, alias, cookie, host, policy-clients or claims`},
		{"gateway-alias", []string{"x-lane"}, `--gateway-alias: "x-lane": "x-lane" is read anyway`},
		{"gateway-lane-cookie", []string{"a;b"}, `--gateway-lane-cookie: "a;b": invalid cookie name`},
		{"gateway-key-header", []string{"a b"}, `--gateway-key-header: "a b": invalid header name`},
		{"gateway-strip-prefix", []string{"/nope"}, `--gateway-strip-prefix: "/nope": no route has this path prefix`},
		{"gateway-preserve-host", []string{"maybe"}, `--gateway-preserve-host: "maybe": want true or false`},
		{"gateway-max-idle-conns-per-host", []string{"-1"}, `--gateway-max-idle-conns-per-host: "-1"`},
		{"gateway-ready-timeout", []string{"soon"}, `--gateway-ready-timeout: "soon"`},
		{"gateway-response-header-timeout", []string{"-1s"}, `--gateway-response-header-timeout: "-1s": want a duration such as 10s, or off`},
		{"gateway-upstream-write-timeout", []string{"soon"}, `--gateway-upstream-write-timeout: "soon": want a duration such as 10s, or off`},
		{"gateway-upstream-read-timeout", []string{"-5s"}, `--gateway-upstream-read-timeout: "-5s": want a duration such as 10s, or off`},
		{"gateway-client-write-timeout", []string{"never"}, `--gateway-client-write-timeout: "never": want a duration such as 10s, or off`},
		{"gateway-http1", []string{"quick"}, `--gateway-http1: "quick": unknown stack "quick": want "fast" or "std"`},
	} {
		c := Defaults()
		c.Set("route", []string{"/=web"})
		err := c.Set(tc.flag, tc.vals)
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--%s %q: %v, want %q", tc.flag, tc.vals, err, tc.want)
		}
	}
}

// step records the lifecycle calls of a fake component.
type step struct {
	name            string
	needs, provides []Dep
	log             *[]string
	fail            string // the step that fails
}

func (s *step) Name() string    { return s.name }
func (s *step) Needs() []Dep    { return s.needs }
func (s *step) Provides() []Dep { return s.provides }
func (s *step) do(what string) error {
	*s.log = append(*s.log, s.name+"."+what)
	if s.fail == what {
		return errors.New(what + " failed")
	}
	return nil
}
func (s *step) Validate(*Config) error { return s.do("validate") }
func (s *step) Provision(_ context.Context, rt *Runtime) error {
	for _, d := range s.needs {
		Need(rt, d.(Key[int]))
	}
	for _, d := range s.provides {
		Provide(rt, d.(Key[int]), 1)
	}
	return s.do("provision")
}
func (s *step) Start(context.Context) error { return s.do("start") }
func (s *step) Stop(context.Context) error  { return s.do("stop") }
func (s *step) Cleanup() error              { return s.do("cleanup") }

func lifecycleOf(t *testing.T, comps ...Component) *lifecycle {
	t.Helper()
	lc, err := newLifecycle(comps, Defaults(), NewLogger(io.Discard, "error"))
	if err != nil {
		t.Fatal(err)
	}
	return lc
}

func TestLifecycleOrder(t *testing.T) {
	var log []string
	lc := lifecycleOf(t, &step{name: "a", log: &log}, &step{name: "b", log: &log})
	if err := lc.up(context.Background()); err != nil {
		t.Fatal(err)
	}
	lc.down(context.Background())
	want := "a.validate b.validate a.provision b.provision a.start b.start b.stop a.stop b.cleanup a.cleanup"
	if got := strings.Join(log, " "); got != want {
		t.Errorf("order:\n got %s\nwant %s", got, want)
	}

	// A failed start stops what started and cleans up everything.
	log = nil
	lc = lifecycleOf(t, &step{name: "a", log: &log}, &step{name: "b", log: &log, fail: "start"}, &step{name: "c", log: &log})
	err := lc.up(context.Background())
	if err == nil || !strings.Contains(err.Error(), "b: start: start failed") {
		t.Fatalf("error %v", err)
	}
	want = "a.validate b.validate c.validate a.provision b.provision c.provision a.start b.start a.stop c.cleanup b.cleanup a.cleanup"
	if got := strings.Join(log, " "); got != want {
		t.Errorf("rollback:\n got %s\nwant %s", got, want)
	}

	// A failed provision cleans up what was provisioned, itself included.
	log = nil
	lc = lifecycleOf(t, &step{name: "a", log: &log}, &step{name: "b", log: &log, fail: "provision"}, &step{name: "c", log: &log})
	if err := lc.up(context.Background()); err == nil {
		t.Fatal("no error")
	}
	want = "a.validate b.validate c.validate a.provision b.provision b.cleanup a.cleanup"
	if got := strings.Join(log, " "); got != want {
		t.Errorf("provision rollback:\n got %s\nwant %s", got, want)
	}

	// A failed validation, of any component, provisions nothing.
	log = nil
	lc = lifecycleOf(t, &step{name: "a", log: &log}, &step{name: "b", log: &log}, &step{name: "c", log: &log, fail: "validate"})
	if err := lc.up(context.Background()); err == nil {
		t.Fatal("no error")
	}
	if got, want := strings.Join(log, " "), "a.validate b.validate c.validate"; got != want {
		t.Errorf("validation failure:\n got %s\nwant %s", got, want)
	}
}

// TestDependencies checks that components are ordered by what they need
// and provide, and that a bad graph is refused before anything runs.
func TestDependencies(t *testing.T) {
	x, y := Key[int]{"x"}, Key[int]{"y"}
	var log []string
	// c needs y from b, b needs x from a; listed backwards, with an
	// independent d kept in its place.
	lc := lifecycleOf(t,
		&step{name: "c", needs: []Dep{y}, log: &log},
		&step{name: "d", log: &log},
		&step{name: "b", needs: []Dep{x}, provides: []Dep{y}, log: &log},
		&step{name: "a", provides: []Dep{x}, log: &log})
	if got, want := strings.Join(names(lc.comps), " "), "d a b c"; got != want {
		t.Errorf("order %s, want %s", got, want)
	}
	if err := lc.up(context.Background()); err != nil {
		t.Fatal(err)
	}
	lc.down(context.Background())

	for _, c := range []struct {
		comps []Component
		want  string
	}{
		{[]Component{&step{name: "a", needs: []Dep{x}}}, "a needs x, which no component provides"},
		{[]Component{&step{name: "a", provides: []Dep{x}}, &step{name: "b", provides: []Dep{x}}}, "x is provided by both a and b"},
		{[]Component{&step{name: "a", needs: []Dep{y}, provides: []Dep{x}}, &step{name: "b", needs: []Dep{x}, provides: []Dep{y}}}, "a, b need each other in a cycle"},
	} {
		if _, err := plan(c.comps); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("plan %v: %v, want %q", names(c.comps), err, c.want)
		}
	}

	// Reading what it did not declare is a programming error, named.
	rt := lifecycleOf(t, &step{name: "a", provides: []Dep{x}}, &step{name: "b"}).views[1]
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "component b reads x, which it does not list in Needs") {
				t.Errorf("recovered %v", r)
			}
		}()
		Need(rt, x)
	}()

	// The built-in components' declarations make a graph.
	ordered, err := plan(builtins())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(names(ordered), " "), "datadir etcd nats registry engine traces claims gateway xds admin"; got != want {
		t.Errorf("built-in order %s, want %s", got, want)
	}
}

// TestDataDirLock checks that a second holder of a data directory is
// refused at once, naming the directory and the holder's process.
func TestDataDirLock(t *testing.T) {
	dir := t.TempDir()
	l, err := lockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = lockDir(dir)
	var iu *InUseError
	if !errors.As(err, &iu) || iu.Dir != dir || iu.PID != os.Getpid() || !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("second lock: %v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, dir) || !strings.Contains(msg, fmt.Sprintf("process %d", os.Getpid())) {
		t.Errorf("message %q names neither the directory nor the process", msg)
	}
	if err := l.release(); err != nil {
		t.Fatal(err)
	}
	l, err = lockDir(dir)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	l.release()
}

// TestStartClose runs the control plane in-process on its embedded etcd:
// it serves, answers its health check, keeps the admin token across a
// restart on the same data directory, and leaves no goroutine behind.
func TestStartClose(t *testing.T) {
	dir := t.TempDir()
	cfg := Defaults()
	cfg.DataDir = dir
	cfg.AdminAddr, cfg.GatewayAddr, cfg.Etcd.ClientAddr, cfg.Etcd.PeerAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.Nats.Addr = "127.0.0.1:0"
	cfg.Traces.GRPCAddr, cfg.Traces.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	var tokens []string
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		s, err := Start(ctx, cfg, WithLogger(NewLogger(io.Discard, "error")))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		adminAPI, _ := Value(s, AdminKey)
		gw, _ := Value(s, GatewayKey)
		nc, _ := Value(s, NatsKey)
		tokens = append(tokens, adminAPI.Token)
		names := []string{}
		for _, a := range s.Addresses() {
			names = append(names, a.Name)
		}
		if strings.Join(names, ",") != "etcd,nats,traces,gateway,admin,dashboard" {
			t.Errorf("addresses %v", s.Addresses())
		}
		hc := &http.Client{Timeout: 10 * time.Second}
		resp, err := hc.Get(adminAPI.URL + "/healthz")
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("healthz: %v %v", resp, err)
		}
		if resp != nil {
			resp.Body.Close()
		}
		// No routes: the gateway answers 404 and says why.
		resp, err = hc.Get(gw.URL + "/")
		if err != nil || resp.StatusCode != http.StatusNotFound {
			t.Errorf("gateway without routes: %v %v", resp, err)
		}
		if resp != nil {
			resp.Body.Close()
		}
		hc.CloseIdleConnections()
		// NATS with JetStream, its data kept across the restart.
		checkNats(t, nc.URL, len(tokens) == 1)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if tokens[0] != tokens[1] || len(tokens[0]) < 16 {
		t.Errorf("admin tokens %q", tokens)
	}
	fi, err := os.Stat(filepath.Join(dir, AdminTokenFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("admin token file: %v %v", fi, err)
	}
}

// checkNats creates a stream on the NATS at url and publishes to it (first),
// or checks that the stream is still there with its message.
func checkNats(t *testing.T, url string, first bool) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("nats at %q: %v", url, err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if first {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.FileStorage}); err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, "t.x", []byte("kept")); err != nil {
			t.Fatal(err)
		}
		return
	}
	st, err := js.Stream(ctx, "T")
	if err != nil {
		t.Fatalf("stream after restart: %v", err)
	}
	if n := st.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("%d messages after restart, want 1", n)
	}
}

// TestNatsConfig: the NATS settings come from flags, variables and the file
// like the others, and bad combinations are refused naming their source.
func TestNatsConfig(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "lanes.yaml")
	os.WriteFile(file, []byte("nats:\n  addr: 127.0.0.1:5222\n"), 0o644)
	c := Defaults()
	if c.Nats.Addr != "127.0.0.1:4222" {
		t.Errorf("default nats addr %q", c.Nats.Addr)
	}
	if err := c.LoadFile(file); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil || c.Nats.Addr != "127.0.0.1:5222" {
		t.Errorf("file: %q %v", c.Nats.Addr, err)
	}
	c.ApplyEnv(env(map[string]string{"LANES_NATS_ADDR": "127.0.0.1:6222"}))
	c.Set("nats-addr", []string{"off"})
	if err := c.Validate(); err != nil || c.Nats.Addr != NatsOff {
		t.Errorf("flag over env over file: %q %v", c.Nats.Addr, err)
	}
	c = Defaults()
	c.ApplyEnv(env(map[string]string{"LANES_NATS_URL": "nats://u:secret@nats-1:4222, nats-2:4222"}))
	if err := c.Validate(); err != nil {
		t.Errorf("external: %v", err)
	}
	for _, tc := range []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{"nats-addr": "nowhere"}, "--nats-addr"},
		{map[string]string{"nats-url": "http://nats:4222"}, `--nats-url: "http://nats:4222": URL 1: scheme "http"`},
		{map[string]string{"nats-url": "nats://u:secret@:4222"}, "no host"},
		{map[string]string{"nats-url": "nats://nats:4222", "nats-addr": "127.0.0.1:1"}, "only for the embedded NATS server"},
	} {
		c := Defaults()
		for k, v := range tc.set {
			c.Set(k, []string{v})
		}
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.set, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("password in %v", err)
		}
	}
}

// TestNatsComponentCluster: --nats-url lists every server of a NATS
// cluster; lanes up starts while one of them is down, and prints them all.
func TestNatsComponentCluster(t *testing.T) {
	c := natstest.NewCluster(t, natstest.ClusterConfig{})
	if err := c.Members[0].Kill(); err != nil {
		t.Fatal(err)
	}
	// The two left elect a meta leader if the killed one led: lanes up starts on a cluster
	// that has lost a member, not during its election.
	wctx, wcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer wcancel()
	if err := c.WaitJetStream(wctx); err != nil {
		t.Fatal(err)
	}
	cfg := Defaults()
	cfg.DataDir = t.TempDir()
	cfg.Nats = NatsConfig{URL: c.URL()}
	if err := cfg.validateNats(); err != nil {
		t.Fatal(err)
	}
	lc, err := newLifecycle([]Component{&dataDirComponent{}, &natsComponent{}}, cfg, NewLogger(io.Discard, "error"))
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.up(context.Background()); err != nil {
		t.Fatalf("with %s down: %v", c.Members[0].Name(), err)
	}
	defer lc.down(context.Background())
	if addrs := lc.sh.addresses; len(addrs) != 1 || addrs[0].URL != c.URL() {
		t.Errorf("addresses %+v, want %s", addrs, c.URL())
	}
}

// TestNatsComponent: an external NATS is checked and printed without its
// password; an unreachable one, or a taken port for the embedded one, fails
// the start naming the setting; off runs none.
func TestNatsComponent(t *testing.T) {
	ext := natstest.Embedded(t)
	log := NewLogger(io.Discard, "error")
	for _, tc := range []struct {
		name, url, addr string
		want            string // "" for success
	}{
		{"external", strings.Replace(ext.URL(), "nats://", "nats://u:pw@", 1), "", ""},
		{"off", "", NatsOff, ""},
		{"unreachable", "nats://127.0.0.1:1", "", "external NATS at nats://127.0.0.1:1 (--nats-url)"},
		{"in use", "", strings.TrimPrefix(ext.URL(), "nats://"), "(--nats-addr)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Defaults()
			cfg.DataDir = t.TempDir()
			cfg.Nats = NatsConfig{URL: tc.url, Addr: tc.addr}
			lc, err := newLifecycle([]Component{&dataDirComponent{}, &natsComponent{}}, cfg, log)
			if err != nil {
				t.Fatal(err)
			}
			err = lc.up(context.Background())
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%v, want %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer lc.down(context.Background())
			addrs, info := lc.sh.addresses, lc.sh.vals[NatsKey.name].(NatsInfo)
			switch tc.name {
			case "external":
				if len(addrs) != 1 || strings.Contains(addrs[0].URL, "pw") || addrs[0].Note != "external, JetStream on" {
					t.Errorf("addresses %+v", addrs)
				}
			case "off":
				if len(addrs) != 0 || info.URL != "" {
					t.Errorf("off: %+v %q", addrs, info.URL)
				}
			}
		})
	}
}
