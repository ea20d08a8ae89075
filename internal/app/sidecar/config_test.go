package sidecar

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestValidate: every bad setting is refused before anything starts, with
// the flag and the value as written.
func TestValidate(t *testing.T) {
	good := Config{Service: "orders", Lane: "alice", Listen: "127.0.0.1:0", App: "127.0.0.1:8081"}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	direct := Config{Service: "orders", App: "127.0.0.1:8081", Direct: true}
	if err := direct.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		edit       func(*Config)
		flag, want string
	}{
		{func(c *Config) { c.Service = "" }, "--service", "required"},
		{func(c *Config) { c.Service = "Bad Name" }, "--service", `"Bad Name"`},
		{func(c *Config) { c.Lane = "no spaces" }, "--lane", `"no spaces"`},
		{func(c *Config) { c.App = "" }, "--app", "required"},
		{func(c *Config) { c.App = "8081" }, "--app", `"8081": not host:port`},
		{func(c *Config) { c.App = "127.0.0.1:0" }, "--app", "1..65535"},
		{func(c *Config) { c.Listen = "" }, "--listen", "required"},
		{func(c *Config) { c.Listen = "127.0.0.1:http" }, "--listen", "0..65535"},
		{func(c *Config) { c.Listen = "example.com:80" }, "--listen", "not an IP"},
		{func(c *Config) { c.Listen = c.App }, "--listen", "app's address"},
		{func(c *Config) { c.Proxy = "0.0.0.0:3128" }, "--proxy", "loopback only"},
		{func(c *Config) { c.Proxy = "10.0.0.1:3128" }, "--proxy", "loopback only"},
		{func(c *Config) { c.Proxy = "127.0.0.1" }, "--proxy", "not host:port"},
		{func(c *Config) { c.Advertise = "host" }, "--advertise", `"host"`},
		{func(c *Config) { c.ReadyPath = "healthz" }, "--ready-path", "absolute path"},
		{func(c *Config) { c.ReadyPath = "/a b" }, "--ready-path", "cannot be in a request path"},
		{func(c *Config) { c.ReadyPath = "/" + strings.Repeat("a", 2000) }, "--ready-path", "longer than"},
		{func(c *Config) { c.TTL = time.Millisecond }, "--ttl", "at least 1s"},
		{func(c *Config) { c.ReadyInterval = -time.Second }, "--ready-interval", "positive"},
		{func(c *Config) { c.MaxConns = -1 }, "--max-conns", `"-1"`},
		{func(c *Config) { c.Direct = true }, "--listen", "--direct takes no inbound traffic"},
	} {
		cfg := good
		c.edit(&cfg)
		err := cfg.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Flag != c.flag || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), c.flag+" ") {
			t.Errorf("%+v: %v, want %s ... %s", cfg, err, c.flag, c.want)
		}
	}
	// Validate starts nothing: a sidecar whose settings are refused opens no listener.
	if _, err := Listen(Config{Service: "orders", Listen: "127.0.0.1:0", App: "x"}, nil, nil); err == nil {
		t.Fatal("Listen took a bad --app")
	}
}

func FuzzValidate(f *testing.F) {
	for _, s := range []string{"127.0.0.1:0", "[::1]:80", ":8080", "localhost:1", "a:b", "", "/healthz", "/x?y=1"} {
		f.Add(s, s, s, s)
	}
	f.Fuzz(func(t *testing.T, listen, app, proxy, path string) {
		c := Config{Service: "orders", Listen: listen, App: app, Proxy: proxy, ReadyPath: path}
		err := c.Validate()
		if err == nil {
			if !loopback(c.Proxy) && c.Proxy != "" {
				t.Fatalf("%q: a proxy off loopback was taken", proxy)
			}
			return
		}
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Flag == "" {
			t.Fatalf("%v: not a FieldError", err)
		}
	})
}
