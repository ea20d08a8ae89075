package cli

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/etcdstore"
	"github.com/lanesdev/lanes/registry"
)

// TestUpInstanceAddresses: an instance address is an authority claim. Through
// `lanes up` as a process: no token registers an address that reaches one
// of the control plane's listeners (etcd's client port, the admin API, the
// gateway itself), by any form of it, nor a link-local or metadata address;
// a token with an address scope registers only within it; and an instance
// written straight into etcd at etcd's port is never dialled by the
// gateway: a lane request falls back to the baseline, and a route with no
// other instance fails with a clear error, never etcd's answer.
func TestUpInstanceAddresses(t *testing.T) {
	u := startUp(t, "up", "--route", "/v3=kv", "--route", "/=web")
	gw := u.gateway + "/"
	aliceTok := u.newToken(t, adminapi.TokenRequest{Lane: "alice", Name: "alice"})
	alice := u.client(t, aliceTok)
	admin := u.client(t, u.token)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	etcdHostPort := strings.TrimPrefix(u.etcd, "http://")
	_, etcdPort, _ := net.SplitHostPort(etcdHostPort)
	refused := func(who string, c interface {
		Register(context.Context, adminapi.RegisterRequest) (adminapi.Registration, error)
	}, l, addr, want string) {
		t.Helper()
		in := registry.Instance{Service: "web", ID: "rogue", Addr: addr, Lane: l}
		_, err := c.Register(ctx, adminapi.RegisterRequest{Instance: in, TTL: adminapi.Duration(time.Minute)})
		var ae *adminapi.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusForbidden || ae.Field != "instance.addr" || ae.Value != addr || !strings.Contains(ae.Message, want) {
			t.Errorf("%s registers %s: %v; want 403 naming instance.addr %q and %q", who, addr, err, addr, want)
		}
	}
	forms := []string{etcdHostPort, "127.0.0.2:" + etcdPort, "[::1]:" + etcdPort, "localhost:" + etcdPort, "0.0.0.0:" + etcdPort}
	for _, a := range []string{u.admin, u.gateway} {
		_, p, _ := net.SplitHostPort(strings.TrimPrefix(a, "http://"))
		forms = append(forms, "127.0.0.2:"+p)
	}
	for _, addr := range forms {
		refused("a lane token", alice, "alice", addr, "control plane's own")
		refused("the admin token", admin, "", addr, "control plane's own")
	}
	for _, addr := range []string{"169.254.169.254:80", "[fd00:ec2::254]:80", "100.100.100.200:80"} {
		refused("a lane token", alice, "alice", addr, "link-local")
	}
	scoped := u.client(t, u.newToken(t, adminapi.TokenRequest{Lane: "alice", Addresses: &adminapi.AddressScope{CIDRs: []string{"127.0.0.0/8"}, Ports: []string{"9000-9999"}}}))
	refused("a scoped token", scoped, "alice", "10.0.0.1:9000", "addresses.cidrs")
	refused("a scoped token", scoped, "alice", "127.0.0.1:80", "addresses.ports")

	// The same scope from the command line; a bad CIDR names its flag.
	if code, _, errOut := u.cli(t, "token", "create", "--lane", "alice", "--cidr", "10.0.0.0/8", "--cidr", "10.0.0.300/8"); code != 2 || !strings.Contains(errOut, `--cidr "10.0.0.300/8"`) {
		t.Errorf("token create with a bad --cidr: exit %d, %q; want 2 naming --cidr and the value", code, errOut)
	}
	code, out, errOut := u.cli(t, "token", "create", "--lane", "alice", "--cidr", "127.0.0.0/8", "--port", "9000-9999")
	if code != 0 {
		t.Fatalf("token create --cidr --port: exit %d %s", code, errOut)
	}
	refused("a token scoped by the command line", u.client(t, strings.TrimSpace(out)), "alice", "127.0.0.1:80", "addresses.ports")

	// Straight into etcd, around the admin API.
	webBase := newBackend(t, "web-base")
	u.register(t, u.newToken(t, adminapi.TokenRequest{Baseline: true}), registry.Instance{Service: "web", ID: "web-base", Addr: webBase.addr})
	c := clientFrom(t, "127.0.0.2")
	expectBackend(t, c, gw, "web-base", header("x-lane", "alice"))
	st, err := etcdstore.Open(ctx, u.etcdConfig(t, "/lanes/"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i, addr := range []string{etcdHostPort, "127.0.0.2:" + etcdPort} {
		l, err := st.Register(ctx, registry.Instance{Service: "web", ID: "etcd-" + strconv.Itoa(i), Addr: addr, Lane: "alice"}, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
	}
	kv, err := st.Register(ctx, registry.Instance{Service: "kv", ID: "etcd", Addr: etcdHostPort}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()

	// Every lane request is the baseline's, until the gateway has tried
	// each etcd instance, found it refused, and ejected it (the admin API
	// shows the engine's outlier state).
	eventually(t, "the gateway to eject the instances at etcd's port", func() string {
		if a := get(t, c, gw, header("x-lane", "alice")); a.Status != http.StatusOK || a.Backend != "web-base" {
			t.Fatalf("a lane request: %d %q, want the baseline's answer", a.Status, a.Body)
		}
		insts, err := admin.Instances(ctx, "web")
		if err != nil {
			return err.Error()
		}
		ejected := 0
		for _, in := range insts {
			if strings.HasPrefix(in.ID, "etcd-") && in.Outlier != nil {
				ejected++
			}
		}
		if ejected < 2 {
			return strconv.Itoa(ejected) + " of 2 ejected"
		}
		return ""
	})
	eventually(t, "a clear error from a route whose only instance is etcd", func() string {
		req, _ := http.NewRequest(http.MethodPost, u.gateway+"/v3/kv/range", strings.NewReader(`{"key":"AA==","range_end":"AA=="}`))
		res, err := c.Do(req)
		if err != nil {
			return err.Error()
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode == http.StatusOK {
			t.Fatalf("etcd answered through the gateway: %s", body)
		}
		if res.StatusCode != http.StatusBadGateway || res.Header.Get("x-lanes-error") != "upstream" || !strings.Contains(string(body), "control plane") {
			return strconv.Itoa(res.StatusCode) + " " + res.Header.Get("x-lanes-error") + " " + string(body)
		}
		return ""
	})
}

// TestUpEtcdAuth: the embedded etcd of `lanes up` takes no write without
// credentials, so that nothing on the machine registers around the admin
// API's scopes; the root password is in the data directory, and
// --etcd-no-auth leaves authentication off.
func TestUpEtcdAuth(t *testing.T) {
	for _, noAuth := range []bool{false, true} {
		var extra []string
		if noAuth {
			extra = append(extra, "--etcd-no-auth")
		}
		u := startUp(t, "up", extra...)
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		cfg := u.etcdConfig(t, "/lanes/")
		cfg.Username, cfg.Password = "", ""
		st, err := etcdstore.Open(ctx, cfg)
		if err == nil {
			var l registry.Lease
			l, err = st.Register(ctx, registry.Instance{Service: "web", ID: "rogue", Addr: "10.0.0.1:80"}, 5*time.Second)
			if err == nil {
				l.Close()
			}
			st.Close()
		}
		if noAuth != (err == nil) {
			t.Errorf("--etcd-no-auth %v: a registration straight into etcd without credentials: %v", noAuth, err)
		}
		if got := strings.Contains(u.Stdout.String(), "LANES_ETCD_PASSWORD_FILE="); got == noAuth {
			t.Errorf("--etcd-no-auth %v: the export line names a password file: %v\n%s", noAuth, got, u.Stdout.String())
		}
		u.Stop(syscall.SIGTERM)
	}
}
