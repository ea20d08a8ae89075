package admin_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"testing"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/app/admin"
	"github.com/lanesdev/lanes/internal/lib/tunnel"
	"github.com/lanesdev/lanes/internal/testkit/etcdtest"
	"github.com/lanesdev/lanes/registry"
)

// TestTunnel: who may open a tunnel for which lane, the registration that
// lives as long as the tunnel, what the machine may dial through it, and
// the tunnels per token.
func TestTunnel(t *testing.T) {
	e := newEnvWith(t, etcdtest.Embedded(t), func(c *admin.Config) { c.MaxTunnels = 2 })
	adm := e.client(t, adminToken)
	alice, err := adm.CreateToken(ctx(t), adminapi.TokenRequest{Lane: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	base, err := adm.CreateToken(ctx(t), adminapi.TokenRequest{Baseline: true})
	if err != nil {
		t.Fatal(err)
	}
	open := func(token, l, id string) (*tunnel.Client, error) {
		q := url.Values{"service": {"web"}, "lane": {l}, "id": {id}}
		return tunnel.Dial(ctx(t), e.url, token, q.Encode(), nil)
	}
	status := func(err error) int {
		var he *tunnel.HandshakeError
		if errors.As(err, &he) {
			return he.Status
		}
		return 0
	}
	for _, tc := range []struct {
		name, token, lane string
		want              int
	}{
		{"another lane", alice.Secret, "bob", http.StatusForbidden},
		{"a baseline token", base.Secret, "alice", http.StatusForbidden},
		{"no lane", alice.Secret, "", http.StatusBadRequest},
		{"no token", "wrong", "alice", http.StatusUnauthorized},
	} {
		if c, err := open(tc.token, tc.lane, "w"); status(err) != tc.want {
			if c != nil {
				c.Close(time.Second)
			}
			t.Errorf("%s: %v, want HTTP %d", tc.name, err, tc.want)
		}
	}

	c, err := open(alice.Secret, "alice", "laptop")
	if err != nil {
		t.Fatal(err)
	}
	h := c.Hello
	insts, err := adm.Instances(ctx(t), "web")
	if err != nil {
		t.Fatal(err)
	}
	if len(insts) != 1 || insts[0].Addr != h.Addr || insts[0].Lane != "alice" || insts[0].Labels[registry.LabelPath] != registry.PathTunnel ||
		insts[0].Labels[registry.LabelTunnelFrom] != "127.0.0.1" || insts[0].Labels[registry.LabelTunnelSince] == "" {
		t.Fatalf("registered %+v; want web/laptop in alice at the relay %s, labelled as a tunnel's", insts, h.Addr)
	}
	// The machine reaches registered instances, and nothing else.
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := c.Open(ctx(t), "dial "+other.Addr().String()); err == nil {
		t.Error("the machine dialled an address that no instance has")
	}
	if _, err := c.Open(ctx(t), "dial "+h.Addr); err != nil {
		t.Errorf("the machine could not dial a registered instance (its own relay): %v", err)
	}
	if _, err := c.Open(ctx(t), "nats"); err == nil {
		t.Error("a control plane without NATS forwarded the nats stream")
	}

	// Two tunnels per token here; the third is refused.
	c2, err := open(alice.Secret, "alice", "laptop-2")
	if err != nil {
		t.Fatal(err)
	}
	if c3, err := open(alice.Secret, "alice", "laptop-3"); status(err) != http.StatusForbidden {
		if c3 != nil {
			c3.Close(time.Second)
		}
		t.Errorf("a third tunnel: %v, want 403 limit_exceeded", err)
	}
	c2.Close(5 * time.Second)

	// Ending the tunnel ends the registration at once, and the relay refuses.
	if !c.Close(5 * time.Second) {
		t.Error("the control plane did not confirm the deregistration")
	}
	if insts, err := adm.Instances(ctx(t), "web"); err != nil || len(insts) != 0 {
		t.Errorf("after the tunnel ended: %+v %v, want no instance", insts, err)
	}
	dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := (&net.Dialer{}).DialContext(dctx, "tcp", h.Addr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("the relay after the tunnel ended: %v, want refused", err)
	}
}
