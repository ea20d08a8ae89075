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

	"go.uber.org/goleak"

	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/internal/etcdtest"
	"github.com/lanesdev/lanes/internal/strictyaml"
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
	if !reflect.DeepEqual(routes, []adminclient.Route{{Prefix: "/a", Service: "orders"}, {Prefix: "/", Service: "web"}}) {
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
	for in, want := range map[string]adminclient.Route{
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
		if strings.Join(names, ",") != "etcd,gateway,admin" {
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
