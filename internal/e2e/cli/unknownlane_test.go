package cli

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/registry"
)

// TestUpUnknownLane checks through the binary that the gateway tells a
// lane that exists nowhere from a known lane without an instance of the
// routed service: x-lane bob (no instance anywhere, no policy) is served by
// the baseline with X-Lane-Fallback unknown_lane, which the gateway's span
// records and lanes trace shows; x-lane alice, whose only instance is of
// another service, with no_instance_in_lane.
func TestUpUnknownLane(t *testing.T) {
	u := startUp(t, "up", "--route", "/=web")
	web := newBackend(t, "web-base")
	u.register(t, u.token, registry.Instance{Service: "web", ID: "web-base", Addr: web.addr})
	mailer := newBackend(t, "mailer-alice")
	u.register(t, u.newToken(t, adminapi.TokenRequest{Lane: "alice"}), registry.Instance{Service: "mailer", ID: "mailer-alice", Addr: mailer.addr, Lane: "alice"})
	c := clientFrom(t, "127.0.0.1")
	expectBackend(t, c, u.gateway+"/", "web-base", nil)

	fallback := func(l string) (string, *http.Response) {
		req, _ := http.NewRequest(http.MethodGet, u.gateway+"/", nil)
		req.Header.Set("x-lane", l)
		resp, err := c.Do(req)
		if err != nil {
			return err.Error(), nil
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Lane-Served") != "baseline" {
			return resp.Status + " served by " + resp.Header.Get("X-Lane-Served"), resp
		}
		return resp.Header.Get("X-Lane-Fallback"), resp
	}
	var bob *http.Response
	eventually(t, "x-lane alice: no_instance_in_lane", func() string {
		if got, _ := fallback("alice"); got != "no_instance_in_lane" {
			return "X-Lane-Fallback " + got
		}
		return ""
	})
	eventually(t, "x-lane bob: unknown_lane", func() string {
		got, resp := fallback("bob")
		if got != "unknown_lane" {
			return "X-Lane-Fallback " + got
		}
		bob = resp
		return ""
	})
	id := bob.Header.Get("X-Trace-Id")
	if len(id) != 32 {
		t.Fatalf("x-trace-id %q", id)
	}
	admin := []string{"--admin", u.admin, "--token", u.token}
	deadline := time.Now().Add(wait)
	for {
		code, out, errOut := run(t, "", append([]string{"trace", id}, admin...)...)
		if code == 0 && strings.Contains(out, "(unknown_lane)") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lanes trace %s: exit %d, no (unknown_lane) within %s:\n%s%s", id, code, wait, out, errOut)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
