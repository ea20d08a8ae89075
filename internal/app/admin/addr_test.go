package admin_test

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/adminclient"
	"github.com/lanesdev/lanes/registry"
)

// wantAddrRefused checks that registering addr with c is refused, 403
// address_refused, naming the field instance.addr, the value as written
// and, in the message, want.
func wantAddrRefused(t *testing.T, who string, c *adminclient.Client, l, addr, want string) {
	t.Helper()
	in := registry.Instance{Service: "web", ID: "w-" + strconv.Itoa(len(addr)) + strings.NewReplacer(":", "", ".", "", "[", "", "]", "").Replace(addr), Addr: addr, Lane: l}
	_, err := c.Register(ctx(t), adminapi.RegisterRequest{Instance: in, TTL: adminapi.Duration(time.Minute)})
	var ae *adminapi.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusForbidden || ae.Code != adminapi.CodeAddress || ae.Field != "instance.addr" || ae.Value != addr || !strings.Contains(ae.Message, want) {
		t.Errorf("%s registers %s: %v, want 403 %s naming instance.addr %q and %q", who, addr, err, adminapi.CodeAddress, addr, want)
	}
}

// An instance address is an authority claim: no token, the admin's
// neither, registers one that reaches the control plane's etcd, by any
// form of its address, nor a link-local or metadata address; a token with
// an address scope registers only within it.
func testAddresses(t *testing.T, e *env) {
	admin := e.client(t, adminToken)
	alice, _ := e.token(t, adminapi.TokenRequest{Lane: "alice"})
	etcd := e.reserved.List()[0].Addr
	port := strconv.Itoa(int(etcd.Port()))
	for _, addr := range []string{etcd.String(), "127.0.0.2:" + port, "[::1]:" + port, "localhost:" + port, "0.0.0.0:" + port, "[::ffff:127.0.0.1]:" + port} {
		wantAddrRefused(t, "alice", alice, "alice", addr, "control plane's own etcd client listener")
		wantAddrRefused(t, "the admin", admin, "", addr, "control plane's own etcd client listener")
	}
	for _, addr := range []string{"169.254.169.254:80", "[fd00:ec2::254]:80", "100.100.100.200:80", "[fe80::1]:80", "169.254.10.10:8080"} {
		wantAddrRefused(t, "alice", alice, "alice", addr, "link-local")
		wantAddrRefused(t, "the admin", admin, "", addr, "link-local")
	}

	// An update under a registration is checked as a registration.
	in := registry.Instance{Service: "web", ID: "web-a", Addr: "10.0.0.1:80", Lane: "alice"}
	reg, err := alice.Register(ctx(t), adminapi.RegisterRequest{Instance: in, TTL: adminapi.Duration(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	in.Addr = "127.0.0.3:" + port
	_, err = alice.Register(ctx(t), adminapi.RegisterRequest{Instance: in, Registration: reg.Registration})
	wantCode(t, "an update to the etcd port", err, http.StatusForbidden, adminapi.CodeAddress)

	// A scope: CIDRs and ports.
	scoped, tok := e.token(t, adminapi.TokenRequest{Lane: "alice", Addresses: &adminapi.AddressScope{CIDRs: []string{"10.0.0.0/8", "2001:db8::/32"}, Ports: []string{"8080", "9000-9099"}}})
	if tok.Addresses == nil || len(tok.Addresses.CIDRs) != 2 {
		t.Fatalf("the token's addresses: %+v", tok.Addresses)
	}
	for _, addr := range []string{"10.1.2.3:8080", "[2001:db8::1]:9050", "[::ffff:10.0.0.1]:9000"} {
		in := registry.Instance{Service: "web", ID: "s-" + strconv.Itoa(len(addr)), Addr: addr, Lane: "alice"}
		if _, err := scoped.Register(ctx(t), adminapi.RegisterRequest{Instance: in, TTL: adminapi.Duration(time.Minute)}); err != nil {
			t.Errorf("scoped token registers %s: %v", addr, err)
		}
	}
	wantAddrRefused(t, "scoped", scoped, "alice", "192.168.1.1:8080", "outside addresses.cidrs [10.0.0.0/8 2001:db8::/32]")
	wantAddrRefused(t, "scoped", scoped, "alice", "10.1.2.3:80", "outside addresses.ports [8080 9000-9099]")
	wantAddrRefused(t, "scoped", scoped, "alice", "no-such-host.invalid:8080", "could not be checked")
	wantAddrRefused(t, "scoped", scoped, "alice", "10.1.2.3:"+port, "outside addresses.ports")

	// A scope is checked when the token is made.
	for _, c := range []struct {
		sc           adminapi.AddressScope
		field, value string
	}{
		{adminapi.AddressScope{CIDRs: []string{"10.0.0.0/8", "10.0.0.300/8"}}, "addresses.cidrs[1]", "10.0.0.300/8"},
		{adminapi.AddressScope{Ports: []string{"0"}}, "addresses.ports[0]", "0"},
		{adminapi.AddressScope{Ports: []string{"90-80"}}, "addresses.ports[0]", "90-80"},
		{adminapi.AddressScope{LinkLocal: true}, "addresses.link_local", "true"},
	} {
		_, err := admin.CreateToken(ctx(t), adminapi.TokenRequest{Lane: "bob", Addresses: &c.sc})
		var ae *adminapi.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Field != c.field || ae.Value != c.value {
			t.Errorf("token with addresses %+v: %v, want 400 naming %s %q", c.sc, err, c.field, c.value)
		}
	}
}

// With the control plane allowing link-local addresses, the admin token and
// a token whose addresses allow them register one; other tokens do not, and
// the control plane's listeners stay refused.
func testLinkLocal(t *testing.T, e *env) {
	plain, _ := e.token(t, adminapi.TokenRequest{Lane: "alice"})
	ll, tok := e.token(t, adminapi.TokenRequest{Lane: "alice", Addresses: &adminapi.AddressScope{LinkLocal: true}})
	if tok.Addresses == nil || !tok.Addresses.LinkLocal {
		t.Fatalf("the token's addresses: %+v", tok.Addresses)
	}
	wantAddrRefused(t, "a token without link_local", plain, "alice", "169.254.169.254:80", "link-local")
	for who, c := range map[string]*adminclient.Client{"the admin": e.client(t, adminToken), "a token with link_local": ll} {
		l := "alice"
		if who == "the admin" {
			l = ""
		}
		in := registry.Instance{Service: "web", ID: "ll-" + strconv.Itoa(len(who)), Addr: "169.254.10.10:8080", Lane: l}
		if _, err := c.Register(ctx(t), adminapi.RegisterRequest{Instance: in, TTL: adminapi.Duration(time.Minute)}); err != nil {
			t.Errorf("%s registers a link-local address: %v", who, err)
		}
	}
	etcd := e.reserved.List()[0].Addr
	wantAddrRefused(t, "a token with link_local", ll, "alice", etcd.String(), "control plane")
}
