package controlplane

import (
	"context"
	"errors"
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
	"github.com/lanesdev/lanes/internal/lib/strictyaml"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/internal/testkit/natstest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, etcdtest.LeakOptions()...)
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
	routes, _ := c.ParsedRoutes()
	if !reflect.DeepEqual(routes, []adminapi.Route{{Prefix: "/a", Service: "orders"}, {Prefix: "/", Service: "web"}}) {
		t.Errorf("routes %+v", routes)
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
	for _, bad := range []string{"web", "=web", "/=", "/=a/b", "host:80=web", ".x=web"} {
		if _, err := ParseRoute(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// step records the lifecycle calls of a fake component.
type step struct {
	name string
	log  *[]string
	fail string // the step that fails
}

func (s *step) Name() string { return s.name }
func (s *step) do(what string) error {
	*s.log = append(*s.log, s.name+"."+what)
	if s.fail == what {
		return errors.New(what + " failed")
	}
	return nil
}
func (s *step) Provision(context.Context, *Runtime) error { return s.do("provision") }
func (s *step) Validate() error                           { return s.do("validate") }
func (s *step) Start(context.Context) error               { return s.do("start") }
func (s *step) Stop(context.Context) error                { return s.do("stop") }
func (s *step) Cleanup() error                            { return s.do("cleanup") }

func TestLifecycleOrder(t *testing.T) {
	var log []string
	lc := &lifecycle{comps: []Component{&step{name: "a", log: &log}, &step{name: "b", log: &log}}}
	if err := lc.up(context.Background(), &Runtime{}); err != nil {
		t.Fatal(err)
	}
	lc.down(context.Background())
	want := "a.provision b.provision a.validate b.validate a.start b.start b.stop a.stop b.cleanup a.cleanup"
	if got := strings.Join(log, " "); got != want {
		t.Errorf("order:\n got %s\nwant %s", got, want)
	}

	// A failed start stops what started and cleans up everything.
	log = nil
	lc = &lifecycle{comps: []Component{&step{name: "a", log: &log}, &step{name: "b", log: &log, fail: "start"}, &step{name: "c", log: &log}}}
	err := lc.up(context.Background(), &Runtime{})
	if err == nil || !strings.Contains(err.Error(), "b: start: start failed") {
		t.Fatalf("error %v", err)
	}
	want = "a.provision b.provision c.provision a.validate b.validate c.validate a.start b.start a.stop c.cleanup b.cleanup a.cleanup"
	if got := strings.Join(log, " "); got != want {
		t.Errorf("rollback:\n got %s\nwant %s", got, want)
	}

	// A failed provision cleans up what was provisioned, itself included.
	log = nil
	lc = &lifecycle{comps: []Component{&step{name: "a", log: &log}, &step{name: "b", log: &log, fail: "provision"}, &step{name: "c", log: &log}}}
	if err := lc.up(context.Background(), &Runtime{}); err == nil {
		t.Fatal("no error")
	}
	want = "a.provision b.provision b.cleanup a.cleanup"
	if got := strings.Join(log, " "); got != want {
		t.Errorf("provision rollback:\n got %s\nwant %s", got, want)
	}
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
	var tokens []string
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		s, err := Start(ctx, cfg, WithLogger(NewLogger(io.Discard, "error")))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		rt := s.Runtime()
		tokens = append(tokens, rt.AdminToken)
		names := []string{}
		for _, a := range s.Addresses() {
			names = append(names, a.Name)
		}
		if strings.Join(names, ",") != "etcd,nats,gateway,admin" {
			t.Errorf("addresses %v", s.Addresses())
		}
		hc := &http.Client{Timeout: 10 * time.Second}
		resp, err := hc.Get(rt.AdminURL + "/healthz")
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("healthz: %v %v", resp, err)
		}
		if resp != nil {
			resp.Body.Close()
		}
		// No routes: the gateway answers 404 and says why.
		resp, err = hc.Get(rt.GatewayURL + "/")
		if err != nil || resp.StatusCode != http.StatusNotFound {
			t.Errorf("gateway without routes: %v %v", resp, err)
		}
		if resp != nil {
			resp.Body.Close()
		}
		hc.CloseIdleConnections()
		// NATS with JetStream, its data kept across the restart.
		checkNats(t, rt.NatsURL, len(tokens) == 1)
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
			rt := &Runtime{Config: Defaults(), Log: log, fatal: make(chan error, 1)}
			rt.Config.DataDir = t.TempDir()
			rt.Config.Nats = NatsConfig{URL: tc.url, Addr: tc.addr}
			lc := &lifecycle{comps: []Component{&natsComponent{}}}
			err := lc.up(context.Background(), rt)
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
			switch tc.name {
			case "external":
				if len(rt.Addresses) != 1 || strings.Contains(rt.Addresses[0].URL, "pw") || rt.Addresses[0].Note != "external, JetStream on" {
					t.Errorf("addresses %+v", rt.Addresses)
				}
			case "off":
				if len(rt.Addresses) != 0 || rt.NatsURL != "" {
					t.Errorf("off: %+v %q", rt.Addresses, rt.NatsURL)
				}
			}
		})
	}
}
