package cli

import (
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/registry"
)

// TestUpTagRulesHeedTokens: through lanes up, an admin's tag rule on a
// label does not move an instance that alice's token registered with that
// label into another lane: a request of that lane never reaches it, and
// `lanes ls` (the admin API) says why.
func TestUpTagRulesHeedTokens(t *testing.T) {
	u := startUp(t, "up", "--route", "/=web")
	apply(t, u, "tags:\n  - {service: web, lane: gray, labels: {version: v2}}\n")
	alice := u.newToken(t, adminapi.TokenRequest{Lane: "alice"})
	base := newBackend(t, "base")
	mine := newBackend(t, "alice-v2")
	u.register(t, u.token, registry.Instance{Service: "web", ID: "web-1", Addr: base.addr})
	u.register(t, alice, registry.Instance{Service: "web", ID: "web-alice", Addr: mine.addr, Lane: "alice", Labels: map[string]string{"version": "v2"}})
	c := &http.Client{Timeout: 10 * time.Second}
	url := u.gateway + "/"
	expectBackend(t, c, url, "alice-v2", header("x-lane", "alice"))
	for i := range 20 {
		if a := get(t, c, url, header("x-lane", "gray")); a.Status != http.StatusOK || a.Backend != "base" || a.Served != "baseline" {
			t.Fatalf("gray request %d: status %d from %q (served %q), want the baseline's answer: alice's token cannot put its instance in gray", i, a.Status, a.Backend, a.Served)
		}
	}
	code, out, errOut := u.cli(t, "ls", "--service", "web", "-o", "json")
	if code != 0 || !strings.Contains(out, `"scope":"alice"`) && !strings.Contains(out, `"scope": "alice"`) || !strings.Contains(out, "does not apply") {
		t.Fatalf("lanes ls: exit %d\n%s\n%s\nwant web-alice's scope and why gray's rule does not apply", code, out, errOut)
	}
}

// TestUpHungInstanceEjected: through lanes up's gateway, a lane instance
// that takes requests and never answers costs one request the
// response-header timeout, with one caller at a time: it is ejected at the
// first timeout and the next requests go to the baseline at once.
func TestUpHungInstanceEjected(t *testing.T) {
	const timeout = 500 * time.Millisecond
	u := startUp(t, "up", "--route", "/=web", "--gateway-response-header-timeout", timeout.String())
	base := newBackend(t, "base")
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts, reads nothing, answers nothing
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	u.register(t, u.token, registry.Instance{Service: "web", ID: "web-1", Addr: base.addr})
	u.register(t, u.token, registry.Instance{Service: "web", ID: "web-hung", Addr: ln.Addr().String(), Lane: "alice"})
	c := &http.Client{Timeout: 30 * time.Second}
	url := u.gateway + "/"
	expectBackend(t, c, url, "base", nil)
	delayed := 0
	for i := range 20 {
		start := time.Now()
		a := get(t, c, url, header("x-lane", "alice"))
		if a.Status != http.StatusOK || a.Backend != "base" {
			t.Fatalf("alice request %d: status %d from %q: %s, want the baseline's answer on the retry", i, a.Status, a.Backend, a.Body)
		}
		if time.Since(start) >= timeout {
			delayed++
		}
	}
	if delayed != 1 {
		t.Fatalf("%d of 20 sequential requests waited for the hung instance, want 1", delayed)
	}
	t.Logf("1 of 20 sequential requests waited %s for the hung instance", timeout)
}
