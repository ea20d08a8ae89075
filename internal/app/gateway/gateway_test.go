package gateway

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/netip"
	"net/textproto"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/routing"
)

func TestRouteByHeader(t *testing.T) { onStacks(t, testRouteByHeader) }

func testRouteByHeader(t *testing.T) {
	w := newWorld(t, "", Config{})
	twoLanes(t, w)
	expectServed(t, w.get(t, "/x", map[string]string{"x-lane": "alice"}), "alice-1", "alice")
	expectServed(t, w.get(t, "/x", map[string]string{"x-lane": " Alice "}), "alice-1", "alice")
	expectServed(t, w.get(t, "/x", nil), "base", "")
	// A lane without instances falls back to the baseline, and keeps its lane.
	expectServed(t, w.get(t, "/x", map[string]string{"x-lane": "bob"}), "base", "bob")
}

func TestRouteByBaggage(t *testing.T) { onStacks(t, testRouteByBaggage) }

func testRouteByBaggage(t *testing.T) {
	w := newWorld(t, "", Config{})
	twoLanes(t, w)
	r := w.get(t, "/x", map[string]string{"baggage": "userId=42,lane=alice;p=1, session=abc"})
	expectServed(t, r, "alice-1", "alice")
	// Upstream: the lane member first, the other members kept in order.
	if got, want := r.echo.hdr(t, "baggage"), "lane=alice,userId=42,session=abc"; got != want {
		t.Errorf("upstream baggage = %q, want %q", got, want)
	}
	if got := r.echo.hdr(t, "x-lane"); got != "alice" {
		t.Errorf("upstream x-lane = %q, want alice", got)
	}
	// x-lane wins over baggage.
	expectServed(t, w.get(t, "/x", map[string]string{"x-lane": "alice", "baggage": "lane=bob"}), "alice-1", "alice")
}

func TestRouteByAlias(t *testing.T) { onStacks(t, testRouteByAlias) }

func testRouteByAlias(t *testing.T) {
	w := newWorld(t, "", Config{Aliases: []string{"x-asm-prefer-tag"}})
	twoLanes(t, w)
	r := w.get(t, "/x", map[string]string{"x-asm-prefer-tag": "alice"})
	expectServed(t, r, "alice-1", "alice")
	if got := r.echo.hdr(t, "x-asm-prefer-tag"); got != "" {
		t.Errorf("the alias header went upstream: %q", got)
	}
	if got := r.echo.hdr(t, "x-lane"); got != "alice" {
		t.Errorf("upstream x-lane = %q, want alice", got)
	}
}

func TestRouteByCookie(t *testing.T) { onStacks(t, testRouteByCookie) }

func testRouteByCookie(t *testing.T) {
	w := newWorld(t, "", Config{})
	twoLanes(t, w)
	expectServed(t, w.get(t, "/x", map[string]string{"cookie": "a=1; lane=alice; b=2"}), "alice-1", "alice")
	expectServed(t, w.get(t, "/x", map[string]string{"cookie": `lane="alice"`}), "alice-1", "alice")
	expectServed(t, w.get(t, "/x", map[string]string{"cookie": "xlane=alice; lanes=alice"}), "base", "")
}

func TestRouteByHost(t *testing.T) { onStacks(t, testRouteByHost) }

func testRouteByHost(t *testing.T) {
	w := newWorld(t, "", Config{
		Domain: "lanes.localhost",
		Routes: []Route{
			{Host: "payments.lanes.localhost", Service: "payments"},
			{Prefix: "/", Service: "orders"},
		},
	})
	twoLanes(t, w)
	payBase := newBackend(t, "pay-base", "")
	payAlice := newBackend(t, "pay-alice", "alice")
	w.register(t, "payments", payBase.id, payBase.addr, "")
	w.register(t, "payments", payAlice.id, payAlice.addr, "alice")

	for _, c := range []struct {
		host, id, lane string
	}{
		{"alice.lanes.localhost", "alice-1", "alice"},
		{"ALICE.Lanes.Localhost:8080", "alice-1", "alice"},
		{"lanes.localhost", "base", ""},
		{"other.example.com", "base", ""},
		// The route on payments.lanes.localhost is no lane host...
		{"payments.lanes.localhost", "pay-base", ""},
		// ...and a lane label in front of it keeps the route.
		{"alice.payments.lanes.localhost", "pay-alice", "alice"},
		{"bob.payments.lanes.localhost", "pay-base", "bob"},
	} {
		t.Run(c.host, func(t *testing.T) {
			expectServed(t, w.get(t, "/x", map[string]string{"host": c.host}), c.id, c.lane)
		})
	}
	// The header comes before the host.
	expectServed(t, w.get(t, "/x", map[string]string{"host": "bob.lanes.localhost", "x-lane": "alice"}), "alice-1", "alice")
}

func TestRouteLongestPrefix(t *testing.T) { onStacks(t, testRouteLongestPrefix) }

// testRouteLongestPrefix: the most specific route wins, in either order of
// the routes: a route on the host before one without, then the longest
// prefix; "/" never shadows a longer prefix listed after it.
func testRouteLongestPrefix(t *testing.T) {
	routes := []Route{
		{Prefix: "/", Service: "orders"},
		{Prefix: "/helloworld.Greeter", Service: "payments"},
		{Prefix: "/helloworld.Greeter/Admin", Service: "refunds"},
		{Host: "shop.example.com", Prefix: "/", Service: "refunds"},
	}
	for _, order := range []string{"given", "reversed"} {
		t.Run(order, func(t *testing.T) {
			rs := append([]Route(nil), routes...)
			if order == "reversed" {
				slices.Reverse(rs)
			}
			w := newWorld(t, "", Config{Routes: rs})
			base := newBackend(t, "orders-base", "")
			pay := newBackend(t, "pay-base", "")
			ref := newBackend(t, "refunds-base", "")
			w.register(t, "orders", base.id, base.addr, "")
			w.register(t, "payments", pay.id, pay.addr, "")
			w.register(t, "refunds", ref.id, ref.addr, "")
			for _, c := range []struct{ host, path, id string }{
				{"", "/x", "orders-base"},
				{"", "/helloworld.Greeter/SayHello", "pay-base"},
				{"", "/helloworld.Greeter", "pay-base"},
				{"", "/helloworld.GreeterX", "orders-base"},
				{"", "/helloworld.Greeter/Admin/Reset", "refunds-base"},
				{"shop.example.com", "/helloworld.Greeter/SayHello", "refunds-base"},
			} {
				h := map[string]string{}
				if c.host != "" {
					h["host"] = c.host
				}
				expectServed(t, w.get(t, c.path, h), c.id, "")
			}
		})
	}
}

func TestRouteByHostDisabled(t *testing.T) { onStacks(t, testRouteByHostDisabled) }

func testRouteByHostDisabled(t *testing.T) {
	w := newWorld(t, "", Config{Domain: "lanes.localhost", Disable: []Source{SourceHost}})
	twoLanes(t, w)
	expectServed(t, w.get(t, "/x", map[string]string{"host": "alice.lanes.localhost"}), "base", "")
}

func TestSourceOrder(t *testing.T) { onStacks(t, testSourceOrder) }

func testSourceOrder(t *testing.T) {
	w := newWorld(t, `
lanes:
  claimed: {clients: ["127.0.0.0/8"]}
`, Config{Domain: "lanes.localhost"})
	base := newBackend(t, "base", "")
	w.register(t, "orders", base.id, base.addr, "")
	for _, ln := range []string{"header", "cookie", "host", "claimed"} {
		b := newBackend(t, ln+"-1", ln)
		w.register(t, "orders", b.id, b.addr, ln)
	}
	all := map[string]string{"x-lane": "header", "cookie": "lane=cookie", "host": "host.lanes.localhost"}
	expectServed(t, w.get(t, "/", all), "header-1", "header")
	delete(all, "x-lane")
	expectServed(t, w.get(t, "/", all), "cookie-1", "cookie")
	delete(all, "cookie")
	expectServed(t, w.get(t, "/", all), "host-1", "host")
	delete(all, "host")
	expectServed(t, w.get(t, "/", all), "claimed-1", "claimed")
}

func TestDisableSources(t *testing.T) { onStacks(t, testDisableSources) }

func testDisableSources(t *testing.T) {
	w := newWorld(t, `
lanes:
  alice: {clients: ["127.0.0.1"]}
`, Config{
		Disable: []Source{SourceHeader, SourceBaggage, SourceAlias, SourceCookie, SourcePolicyClients, SourceClaims},
		Claims:  func(netip.Addr) (string, bool) { return "alice", true },
	})
	twoLanes(t, w)
	r := w.get(t, "/", map[string]string{"x-lane": "alice", "cookie": "lane=alice", "baggage": "lane=alice,k=v"})
	expectServed(t, r, "base", "")
	if got := r.echo.hdr(t, "x-lane"); got != "" {
		t.Errorf("a disabled x-lane went upstream: %q", got)
	}
	if got := withoutKey(r.echo.hdr(t, "baggage")); got != "k=v" {
		t.Errorf("upstream baggage = %q, want k=v and the request key", got)
	}
}

func TestRouteByStaticClaim(t *testing.T) { onStacks(t, testRouteByStaticClaim) }

func testRouteByStaticClaim(t *testing.T) {
	w := newWorld(t, `
lanes:
  alice: {clients: ["127.0.0.2", "10.9.0.0/16"]}
  bob: {clients: ["127.0.0.0/24"]}
`, Config{})
	base, _ := twoLanes(t, w)
	bob := newBackend(t, "bob-1", "bob")
	w.register(t, "orders", bob.id, bob.addr, "bob")

	expectServed(t, do(t, clientFrom(t, "127.0.0.2"), "GET", w.url+"/", nil), "alice-1", "alice") // the most specific claim
	expectServed(t, do(t, clientFrom(t, "127.0.0.3"), "GET", w.url+"/", nil), "bob-1", "bob")
	expectServed(t, do(t, clientFrom(t, "127.0.1.1"), "GET", w.url+"/", nil), base.id, "")
	// A spoofed X-Forwarded-For from an untrusted peer is ignored.
	expectServed(t, do(t, clientFrom(t, "127.0.1.1"), "GET", w.url+"/", map[string]string{"x-forwarded-for": "10.9.1.1"}), base.id, "")
}

func TestExpiredClaim(t *testing.T) { onStacks(t, testExpiredClaim) }

func testExpiredClaim(t *testing.T) {
	w := newWorld(t, `
lanes:
  alice: {clients: ["127.0.0.0/8"], expires: 2001-01-01T00:00:00Z}
`, Config{})
	twoLanes(t, w)
	expectServed(t, w.get(t, "/", nil), "base", "")
}

func TestRouteByDynamicClaim(t *testing.T) { onStacks(t, testRouteByDynamicClaim) }

func testRouteByDynamicClaim(t *testing.T) {
	var mu sync.Mutex
	claims := map[netip.Addr]string{netip.MustParseAddr("127.0.0.4"): "alice", netip.MustParseAddr("10.1.2.3"): "alice"}
	var asked []netip.Addr
	w := newWorld(t, `
lanes:
  bob: {clients: ["127.0.0.5"]}
`, Config{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.6/32")},
		Claims: func(a netip.Addr) (string, bool) {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, a)
			l, ok := claims[a]
			return l, ok
		},
	})
	base, _ := twoLanes(t, w)
	bob := newBackend(t, "bob-1", "bob")
	w.register(t, "orders", bob.id, bob.addr, "bob")

	expectServed(t, do(t, clientFrom(t, "127.0.0.4"), "GET", w.url+"/", nil), "alice-1", "alice")
	// The static claim of the policy comes first.
	expectServed(t, do(t, clientFrom(t, "127.0.0.5"), "GET", w.url+"/", nil), "bob-1", "bob")
	// Untrusted peer: its X-Forwarded-For is ignored.
	expectServed(t, do(t, clientFrom(t, "127.0.0.7"), "GET", w.url+"/", map[string]string{"x-forwarded-for": "10.1.2.3"}), base.id, "")
	// Trusted proxy: the right-most untrusted address is the client.
	tp := clientFrom(t, "127.0.0.6")
	r := do(t, tp, "GET", w.url+"/", map[string]string{"x-forwarded-for": "10.1.2.3"})
	expectServed(t, r, "alice-1", "alice")
	if got, want := r.echo.hdr(t, "x-forwarded-for"), "10.1.2.3, 127.0.0.6"; got != want {
		t.Errorf("upstream x-forwarded-for = %q, want %q", got, want)
	}
	// A spoofed left-most entry does not count: the proxy appended the real client.
	expectServed(t, do(t, tp, "GET", w.url+"/", map[string]string{"x-forwarded-for": "10.1.2.3, 192.0.2.1"}), base.id, "")
	// Trusted hops on the right are skipped.
	expectServed(t, do(t, tp, "GET", w.url+"/", map[string]string{"x-forwarded-for": "192.0.2.1, 10.1.2.3, 127.0.0.6"}), "alice-1", "alice")

	mu.Lock()
	defer mu.Unlock()
	for _, a := range asked {
		if a == netip.MustParseAddr("127.0.0.5") {
			t.Errorf("Claims was asked about a client that the policy claims")
		}
	}
}

func TestUntrustedForwardingHeadersDropped(t *testing.T) {
	onStacks(t, testUntrustedForwardingHeadersDropped)
}

func testUntrustedForwardingHeadersDropped(t *testing.T) {
	w := newWorld(t, "", Config{})
	twoLanes(t, w)
	r := w.get(t, "/", map[string]string{"x-forwarded-for": "10.1.2.3", "x-forwarded-proto": "https", "forwarded": "for=10.1.2.3"})
	expectServed(t, r, "base", "")
	if got := r.echo.hdr(t, "x-forwarded-for"); got != "127.0.0.1" {
		t.Errorf("upstream x-forwarded-for = %q, want the peer 127.0.0.1 only", got)
	}
	if got := r.echo.hdr(t, "x-forwarded-proto"); got != "http" {
		t.Errorf("upstream x-forwarded-proto = %q, want http", got)
	}
	if got := r.echo.hdr(t, "forwarded"); got != "" {
		t.Errorf("upstream forwarded = %q, want none", got)
	}
}

func TestLaneChoiceNone(t *testing.T) { onStacks(t, testLaneChoiceNone) }

func testLaneChoiceNone(t *testing.T) {
	w := newWorld(t, "gateway: {lane_choice: none}\n", Config{Aliases: []string{"x-tag"}})
	twoLanes(t, w)
	r := w.get(t, "/", map[string]string{"x-lane": "alice", "baggage": "lane=alice,k=v", "x-tag": "alice"})
	expectServed(t, r, "base", "")
	for _, k := range []string{"x-lane", "x-tag"} {
		if got := r.echo.hdr(t, k); got != "" {
			t.Errorf("upstream %s = %q, want none", k, got)
		}
	}
	if got := withoutKey(r.echo.hdr(t, "baggage")); got != "k=v" {
		t.Errorf("upstream baggage = %q, want k=v and the request key", got)
	}
	// Not allowed to choose means not read either: an invalid value is no error.
	expectServed(t, w.get(t, "/", map[string]string{"x-lane": "-bad-"}), "base", "")
	// Nor does the cookie (TestLaneChoiceGovernsEverySource has each source).
	expectServed(t, w.get(t, "/", map[string]string{"x-lane": "bob", "cookie": "lane=alice"}), "base", "")
}

func TestLaneChoiceAllowlist(t *testing.T) { onStacks(t, testLaneChoiceAllowlist) }

func testLaneChoiceAllowlist(t *testing.T) {
	w := newWorld(t, `
gateway:
  lane_choice: allowlist
  allow: ["127.0.0.8/32"]
`, Config{})
	twoLanes(t, w)
	r := do(t, clientFrom(t, "127.0.0.8"), "GET", w.url+"/", map[string]string{"x-lane": "alice"})
	expectServed(t, r, "alice-1", "alice")
	r = do(t, clientFrom(t, "127.0.0.9"), "GET", w.url+"/", map[string]string{"x-lane": "alice", "baggage": "lane=alice"})
	expectServed(t, r, "base", "")
	if got := r.echo.hdr(t, "x-lane"); got != "" {
		t.Errorf("upstream x-lane = %q from a client not allowed to choose", got)
	}
	if got := withoutKey(r.echo.hdr(t, "baggage")); got != "" {
		t.Errorf("upstream baggage = %q, want the request key alone", got)
	}

	// A policy change applies without a restart.
	w.setPolicy(t, "gateway: {lane_choice: all}\n")
	expectServed(t, do(t, clientFrom(t, "127.0.0.9"), "GET", w.url+"/", map[string]string{"x-lane": "alice"}), "alice-1", "alice")
}

func TestInvalidLane(t *testing.T) { onStacks(t, testInvalidLane) }

func testInvalidLane(t *testing.T) {
	w := newWorld(t, "", Config{Domain: "lanes.localhost", Aliases: []string{"x-tag"}, Claims: func(a netip.Addr) (string, bool) {
		return "", false
	}})
	base, _ := twoLanes(t, w)
	for _, c := range []struct {
		name   string
		header map[string]string
		rule   lane.Rule
		source string
	}{
		{"header-chars", map[string]string{"x-lane": "al_ice"}, lane.RuleChars, `header "x-lane"`},
		{"header-edge", map[string]string{"x-lane": "-alice"}, lane.RuleEdge, `header "x-lane"`},
		{"header-long", map[string]string{"x-lane": strings.Repeat("a", 64)}, lane.RuleTooLong, `header "x-lane"`},
		{"baggage", map[string]string{"baggage": "lane=al%20ice"}, lane.RuleChars, `the "lane" member of header "baggage"`},
		{"alias", map[string]string{"x-tag": "alice!"}, lane.RuleChars, `header "x-tag"`},
		{"cookie", map[string]string{"cookie": "lane=alice-"}, lane.RuleEdge, `cookie "lane"`},
		{"host", map[string]string{"host": "al_ice.lanes.localhost"}, lane.RuleChars, `host "al_ice.lanes.localhost"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := w.get(t, "/", c.header)
			if r.status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400", r.status)
			}
			if !strings.Contains(r.body, fmt.Sprintf("rule %q", c.rule)) || !strings.Contains(r.body, c.source) {
				t.Errorf("body %q does not name the rule %q and the source %s", r.body, c.rule, c.source)
			}
			if got := r.header.Get("X-Lanes-Error"); got != "invalid_lane" {
				t.Errorf("x-lanes-error = %q, want invalid_lane", got)
			}
		})
	}
	if n := base.hits.Load(); n != 0 {
		t.Errorf("the backend got %d requests with invalid lanes", n)
	}
}

func TestInvalidDynamicClaim(t *testing.T) { onStacks(t, testInvalidDynamicClaim) }

func testInvalidDynamicClaim(t *testing.T) {
	w := newWorld(t, "", Config{Claims: func(a netip.Addr) (string, bool) { return "Bad Lane", true }})
	twoLanes(t, w)
	r := w.get(t, "/", nil)
	if r.status != http.StatusBadRequest || !strings.Contains(r.body, `rule "characters"`) || !strings.Contains(r.body, "claim of client 127.0.0.1") {
		t.Errorf("got %d %q, want 400 naming the claim and the rule", r.status, r.body)
	}
}

func TestResponseHeaders(t *testing.T) { onStacks(t, testResponseHeaders) }

func testResponseHeaders(t *testing.T) {
	w := newWorld(t, "lanes:\n  team: {}\n  alice: {fallback: [team]}\n", Config{})
	base := newBackend(t, "base", "")
	team := newBackend(t, "team-1", "team")
	w.register(t, "orders", base.id, base.addr, "")
	w.register(t, "orders", team.id, team.addr, "team")
	// alice falls back to team: x-lane is the request lane, x-lane-served the instance's.
	r := w.get(t, "/", map[string]string{"x-lane": "alice"})
	if r.header.Get("X-Lane") != "alice" || r.header.Get("X-Lane-Served") != "team" {
		t.Errorf("x-lane %q, x-lane-served %q; want alice, team", r.header.Get("X-Lane"), r.header.Get("X-Lane-Served"))
	}
	r = w.get(t, "/", nil)
	if _, ok := r.header["X-Lane"]; ok || r.header.Get("X-Lane-Served") != "baseline" {
		t.Errorf("baseline: x-lane %q, x-lane-served %q; want none, baseline", r.header.Values("X-Lane"), r.header.Get("X-Lane-Served"))
	}
}

// TestEarlyHints checks that the lane headers survive a 1xx response, after
// which the proxy clears the response's header map.
func TestEarlyHints(t *testing.T) { onStacks(t, testEarlyHints) }

func testEarlyHints(t *testing.T) {
	w := newWorld(t, "", Config{})
	_, alice := twoLanes(t, w)
	alice.hints.Store(true)
	var hints []int
	req, err := http.NewRequest(http.MethodGet, w.url+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-lane", "alice")
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			hints = append(hints, code)
			return nil
		},
	}))
	resp, err := w.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(hints) != 1 || hints[0] != http.StatusEarlyHints {
		t.Errorf("1xx responses %v, want [103]", hints)
	}
	if resp.Header.Get("X-Lane") != "alice" || resp.Header.Get("X-Lane-Served") != "alice" {
		t.Errorf("after a 103: x-lane %q, x-lane-served %q", resp.Header.Get("X-Lane"), resp.Header.Get("X-Lane-Served"))
	}
}

// TestEarlyHintsRules: a 1xx answer reaches the client without the
// instance's lane headers; an HTTP/1.0 client gets no 1xx answer (RFC
// 9110, 15.2), only the final one; a chunked request still closes its
// connection after the answer when a 1xx came before it (the proxy clears
// the response's header map after a 1xx).
func TestEarlyHintsRules(t *testing.T) { onStacks(t, testEarlyHintsRules) }

func testEarlyHintsRules(t *testing.T) {
	w := newWorld(t, "", Config{})
	_, alice := twoLanes(t, w)
	alice.hints.Store(true)
	t.Run("http1.0", func(t *testing.T) {
		br := w.send(t, "GET / HTTP/1.0\r\nHost: x\r\nx-lane: alice\r\n\r\n")
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		if res.StatusCode != http.StatusOK || res.Header.Get(hLaneServed) != "alice" {
			t.Errorf("HTTP/1.0 client: first answer %d (x-lane-served %q), want 200 from alice and no 1xx", res.StatusCode, res.Header.Get(hLaneServed))
		}
	})
	t.Run("chunked", func(t *testing.T) {
		br := w.send(t, "POST / HTTP/1.1\r\nHost: x\r\nx-lane: alice\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n")
		res, err := http.ReadResponse(br, nil)
		if err != nil || res.StatusCode != http.StatusEarlyHints {
			t.Fatalf("first answer %v, %v; want 103", res, err)
		}
		if v := res.Header.Values(hLaneServed); len(v) != 0 || res.Header.Get("Link") == "" {
			t.Errorf("the 103: x-lane-served %q (the instance's, which must not reach the client), Link %q", v, res.Header.Get("Link"))
		}
		if res, err = http.ReadResponse(br, nil); err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		if res.StatusCode != http.StatusOK || !res.Close {
			t.Errorf("after a 103, the answer to a chunked request: %d, Connection %q; want 200 and close", res.StatusCode, res.Header.Values("Connection"))
		}
		if n, err := br.ReadByte(); err != io.EOF {
			t.Errorf("after the answer to a chunked request: read %q, %v; want the connection closed", n, err)
		}
	})
}

func TestNoInstance(t *testing.T) { onStacks(t, testNoInstance) }

func testNoInstance(t *testing.T) {
	w := newWorld(t, "lanes:\n  strict: {strict: true}\n", Config{})
	alice := newBackend(t, "alice-1", "alice")
	w.register(t, "orders", alice.id, alice.addr, "alice")
	r := w.get(t, "/", nil)
	if r.status != http.StatusServiceUnavailable || r.header.Get("X-Lanes-Error") != "no_instance" {
		t.Fatalf("got %d, x-lanes-error %q; want 503 no_instance", r.status, r.header.Get("X-Lanes-Error"))
	}
	if !strings.Contains(r.body, "no_instance") || !strings.Contains(r.body, `"orders"`) {
		t.Errorf("body %q does not name the code and the service", r.body)
	}
	r = w.get(t, "/", map[string]string{"x-lane": "strict"})
	if r.status != http.StatusServiceUnavailable || r.header.Get("X-Lanes-Error") != "lane_unavailable" ||
		!strings.Contains(r.body, `"strict"`) || r.header.Get("X-Lane") != "strict" {
		t.Errorf("strict lane: got %d %q, x-lanes-error %q, x-lane %q", r.status, r.body, r.header.Get("X-Lanes-Error"), r.header.Get("X-Lane"))
	}
	if n := alice.hits.Load(); n != 0 {
		t.Errorf("a baseline request reached a lane instance %d times", n)
	}
}

func TestUnknownRoute(t *testing.T) { onStacks(t, testUnknownRoute) }

func testUnknownRoute(t *testing.T) {
	w := newWorld(t, "", Config{Routes: []Route{
		{Host: "orders.example.com", Service: "orders"},
		{Prefix: "/api/", Service: "orders"},
	}})
	twoLanes(t, w)
	for _, c := range []struct{ host, path string }{
		{"other.example.com", "/x"},
		{"other.example.com", "/apix"},
	} {
		r := w.get(t, c.path, map[string]string{"host": c.host})
		if r.status != http.StatusNotFound || r.header.Get("X-Lanes-Error") != "no_route" {
			t.Errorf("%s%s: got %d %q, want 404 no_route", c.host, c.path, r.status, r.header.Get("X-Lanes-Error"))
		}
	}
	expectServed(t, w.get(t, "/x", map[string]string{"host": "Orders.Example.com:80"}), "base", "")
	expectServed(t, w.get(t, "/api", map[string]string{"host": "other"}), "base", "")
}

func TestPathPrefix(t *testing.T) { onStacks(t, testPathPrefix) }

func testPathPrefix(t *testing.T) {
	w := newWorld(t, "", Config{Routes: []Route{
		{Prefix: "/orders/", StripPrefix: true, Service: "orders"},
		{Prefix: "/keep", Service: "orders"},
		{Prefix: "/", Service: "default"},
	}})
	base := newBackend(t, "base", "")
	def := newBackend(t, "default", "")
	w.register(t, "orders", base.id, base.addr, "")
	w.register(t, "default", def.id, def.addr, "")
	for _, c := range []struct{ in, id, path, query, raw string }{
		{"/orders/42?x=1", "base", "/42", "x=1", ""},
		{"/orders", "base", "/", "", ""},
		{"/orders/", "base", "/", "", ""},
		{"/orders/a%2Fb", "base", "/a/b", "", "/a%2Fb"},
		{"/keep/1", "base", "/keep/1", "", ""},
		{"/keep", "base", "/keep", "", ""},
		{"/keeper", "default", "/keeper", "", ""},
		{"/ordersx", "default", "/ordersx", "", ""},
	} {
		r := w.get(t, c.in, nil)
		if r.echo.ID != c.id || r.echo.Path != c.path || r.echo.Query != c.query || r.echo.RawPath != c.raw {
			t.Errorf("%s: served by %q at %q (raw %q) ?%q; want %q at %q (raw %q) ?%q", c.in, r.echo.ID, r.echo.Path, r.echo.RawPath, r.echo.Query, c.id, c.path, c.raw, c.query)
		}
	}
}

func TestUpstreamLaneHeaders(t *testing.T) { onStacks(t, testUpstreamLaneHeaders) }

func testUpstreamLaneHeaders(t *testing.T) {
	w := newWorld(t, "", Config{})
	twoLanes(t, w)
	// A lane request: x-lane and the baggage member, other members kept.
	r := w.get(t, "/", map[string]string{"x-lane": "alice", "baggage": "a=1,lane=bob,b=2"})
	expectServed(t, r, "alice-1", "alice")
	if got := r.echo.hdr(t, "x-lane"); got != "alice" {
		t.Errorf("upstream x-lane = %q", got)
	}
	if got := r.echo.hdr(t, "baggage"); got != "lane=alice,a=1,b=2" {
		t.Errorf("upstream baggage = %q", got)
	}
	// A baseline request: no lane headers at all.
	r = w.get(t, "/", map[string]string{"baggage": "a=1, b=2"})
	expectServed(t, r, "base", "")
	if got := r.echo.hdr(t, "x-lane"); got != "" {
		t.Errorf("baseline: upstream x-lane = %q", got)
	}
	if got := withoutKey(r.echo.hdr(t, "baggage")); got != "a=1,b=2" {
		t.Errorf("baseline: upstream baggage = %q, want its members and the request key", got)
	}
	// The forwarding headers and the host.
	if got := r.echo.hdr(t, "x-forwarded-host"); got != w.addr {
		t.Errorf("x-forwarded-host = %q, want %q", got, w.addr)
	}
	if r.echo.Host == w.addr {
		t.Errorf("upstream Host = %q, want the instance's address", r.echo.Host)
	}
}

func TestPreserveHost(t *testing.T) { onStacks(t, testPreserveHost) }

func testPreserveHost(t *testing.T) {
	w := newWorld(t, "", Config{PreserveHost: true})
	twoLanes(t, w)
	r := w.get(t, "/", map[string]string{"host": "shop.example.com"})
	if r.echo.Host != "shop.example.com" {
		t.Errorf("upstream Host = %q, want shop.example.com", r.echo.Host)
	}
}

func TestCanarySplit(t *testing.T) { onStacks(t, testCanarySplit) }

func testCanarySplit(t *testing.T) {
	w := newWorld(t, `
canary:
  - {service: orders, lane: canary, percent: 30}
`, Config{})
	base := newBackend(t, "base", "")
	can := newBackend(t, "canary-1", "canary")
	w.register(t, "orders", base.id, base.addr, "")
	w.register(t, "orders", can.id, can.addr, "canary")

	const n = 1000
	first := map[string]string{}
	canaries := 0
	for i := range n {
		key := fmt.Sprintf("user-%d", i)
		h := map[string]string{"x-lanes-key": key}
		if i%2 == 1 {
			h = map[string]string{"cookie": "lanes-key=" + key}
		}
		r := w.get(t, "/", h)
		if r.status != 200 {
			t.Fatalf("status %d", r.status)
		}
		first[key] = r.echo.ID
		if r.echo.ID == can.id {
			canaries++
			expectServed(t, r, can.id, "canary")
			if got := r.echo.hdr(t, "x-lane"); got != "canary" {
				t.Fatalf("a canary request went upstream with x-lane %q", got)
			}
		} else {
			expectServed(t, r, base.id, "")
		}
	}
	share := float64(canaries) / n
	// 30% of 1000 stable hashes: the binomial standard deviation is 1.4%.
	if math.Abs(share-0.30) > 0.06 {
		t.Errorf("canary share %.3f, want 0.30 ± 0.06", share)
	}
	// Sticky: the same key gets the same answer, by header or by cookie.
	for i := 0; i < n; i += 37 {
		key := fmt.Sprintf("user-%d", i)
		for _, h := range []map[string]string{{"x-lanes-key": key}, {"cookie": "lanes-key=" + key}} {
			if r := w.get(t, "/", h); r.echo.ID != first[key] {
				t.Errorf("key %s: served by %s, first by %s", key, r.echo.ID, first[key])
			}
		}
	}
	// A lane request is never split.
	for range 20 {
		expectServed(t, w.get(t, "/", map[string]string{"x-lane": "alice", "x-lanes-key": "user-1"}), base.id, "alice")
	}
}

func TestOutlierEjection(t *testing.T) { onStacks(t, testOutlierEjection) }

func testOutlierEjection(t *testing.T) {
	w := newWorld(t, "outlier: {errors: 2, window: 1m, ejection: 10m}\n", Config{})
	good := newBackend(t, "good", "")
	bad := newBackend(t, "bad", "")
	bad.status.Store(http.StatusInternalServerError)
	w.register(t, "orders", good.id, good.addr, "")
	w.register(t, "orders", bad.id, bad.addr, "")
	// Round robin sends every other request to bad until it is ejected.
	for i := 0; i < 20; i++ {
		w.get(t, "/", nil)
	}
	hits := bad.hits.Load()
	if hits < 2 || hits > 3 {
		t.Errorf("the failing instance took %d requests; want it ejected after 2 failures", hits)
	}
	for range 20 {
		expectServed(t, w.get(t, "/", nil), good.id, "")
	}
	if got := bad.hits.Load(); got != hits {
		t.Errorf("the ejected instance took %d more requests", got-hits)
	}
}

// TestRetryOnConnectionRefused: a refused connection sent nothing, so every
// request, whatever its method and body, moves on to another instance.
func TestRetryOnConnectionRefused(t *testing.T) { onStacks(t, testRetryOnConnectionRefused) }

func testRetryOnConnectionRefused(t *testing.T) {
	w := newWorld(t, "outlier: {errors: 1000, window: 1m, ejection: 10m}\n", Config{})
	good := newBackend(t, "good", "")
	// A port nobody listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	w.register(t, "orders", good.id, good.addr, "")
	w.register(t, "orders", "dead", dead, "")
	for i := range 10 {
		r := w.get(t, fmt.Sprintf("/%d", i), nil)
		expectServed(t, r, good.id, "")
	}
	for range 10 {
		req, err := http.NewRequest(http.MethodPost, w.url+"/", strings.NewReader("order"))
		if err != nil {
			t.Fatal(err)
		}
		res, err := w.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || !strings.Contains(string(body), `"good"`) {
			t.Fatalf("POST with a body: %d %s", res.StatusCode, body)
		}
	}
}

// resetter reads each request and then resets the connection: the request
// was sent, and no answer comes.
func resetter(t *testing.T) string {
	return acceptLoop(t, func(conn net.Conn) {
		if req, err := http.ReadRequest(bufio.NewReader(conn)); err == nil {
			io.Copy(io.Discard, req.Body)
		}
		conn.(*net.TCPConn).SetLinger(0)
		conn.Close()
	})
}

// TestNoRetryOfSentPOST: a POST that reached an instance that then failed
// it is not sent again; a GET is.
func TestNoRetryOfSentPOST(t *testing.T) { onStacks(t, testNoRetryOfSentPOST) }

func testNoRetryOfSentPOST(t *testing.T) {
	w := newWorld(t, "outlier: {errors: 1000, window: 1m, ejection: 10m}\n", Config{})
	good := newBackend(t, "good", "")
	w.register(t, "orders", good.id, good.addr, "")
	w.register(t, "orders", "reset", resetter(t), "")
	for i := range 10 {
		expectServed(t, w.get(t, fmt.Sprintf("/%d", i), nil), good.id, "")
	}
	bad := 0
	for range 10 {
		r := do(t, w.client, http.MethodPost, w.url+"/", nil)
		switch r.status {
		case http.StatusOK:
		case http.StatusBadGateway:
			bad++
			if r.header.Get("X-Lanes-Error") != "upstream" || !strings.Contains(r.body, `"reset"`) {
				t.Errorf("502: x-lanes-error %q, body %q", r.header.Get("X-Lanes-Error"), r.body)
			}
		default:
			t.Fatalf("POST: status %d", r.status)
		}
	}
	if bad == 0 {
		t.Errorf("no POST reached the resetting instance: retried, or not balanced")
	}
}

// TestRetryFollowsTheLaneChain: when the only instance of a lane takes a
// request and then fails it (it resets the connection, or does not answer
// within the response-header timeout), a GET is retried along the lane
// chain, although the instance is not ejected; a POST is not.
func TestRetryFollowsTheLaneChain(t *testing.T) { onStacks(t, testRetryFollowsTheLaneChain) }

func testRetryFollowsTheLaneChain(t *testing.T) {
	t.Run("reset", func(t *testing.T) {
		w := newWorld(t, "outlier: {errors: 1000, window: 1m, ejection: 10m}\nlanes:\n  alice: {fallback: [team]}\n", Config{})
		base, team := newBackend(t, "base", ""), newBackend(t, "team-1", "team")
		w.register(t, "orders", base.id, base.addr, "")
		w.register(t, "orders", team.id, team.addr, "team")
		w.register(t, "orders", "reset", resetter(t), "alice")
		alice := map[string]string{"x-lane": "alice"}
		for i := range 4 {
			r := w.get(t, fmt.Sprintf("/%d", i), alice)
			expectServed(t, r, team.id, "alice")
			if got := r.echo.hdr(t, "X-Lane"); got != "alice" {
				t.Fatalf("the fallback got x-lane %q, want alice", got)
			}
		}
		if d, err := w.engine.Service("orders").Resolve(routing.Request{Lane: "alice"}); err != nil || d.Lane != "alice" {
			t.Fatalf("alice after the retries: %+v, %v; want its instance still eligible", d, err)
		}
		hits := team.hits.Load()
		r := do(t, w.client, http.MethodPost, w.url+"/", alice)
		if r.status != http.StatusBadGateway || r.header.Get("X-Lanes-Error") != "upstream" || team.hits.Load() != hits {
			t.Fatalf("POST in lane alice: %d %q (the fallback's hits %d, were %d); want 502 upstream, no retry",
				r.status, r.header.Get("X-Lanes-Error"), team.hits.Load(), hits)
		}
	})
	t.Run("hung", func(t *testing.T) {
		w := newWorld(t, "outlier: {errors: 1000, window: 1m, ejection: 10m}\n", Config{ResponseHeaderTimeout: hungTimeout})
		base := newBackend(t, "base", "")
		w.register(t, "orders", base.id, base.addr, "")
		w.register(t, "orders", "hung", hungServer(t), "alice")
		for i := range 2 {
			expectServed(t, w.get(t, fmt.Sprintf("/%d", i), map[string]string{"x-lane": "alice"}), base.id, "alice")
		}
	})
}

func TestConnectionErrorsEject(t *testing.T) { onStacks(t, testConnectionErrorsEject) }

func testConnectionErrorsEject(t *testing.T) {
	w := newWorld(t, "outlier: {errors: 2, window: 1m, ejection: 10m}\n", Config{})
	good := newBackend(t, "good", "")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	w.register(t, "orders", good.id, good.addr, "")
	w.register(t, "orders", "dead", dead, "")
	for range 6 {
		do(t, w.client, http.MethodPost, w.url+"/", nil)
	}
	for range 10 {
		r := do(t, w.client, http.MethodPost, w.url+"/", nil)
		expectServed(t, r, good.id, "")
	}
}

// hungTimeout is the response-header timeout of the tests with a
// hungServer. It bounds the healthy instance's answer to the retry too, so
// it must hold on a loaded machine under -race.
const hungTimeout = time.Second

// hungServer serves HTTP on a loopback address, which it returns, and
// answers no request until the end of the test.
func hungServer(t *testing.T) string {
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(hung.Close)
	t.Cleanup(func() { close(release) }) // before the server's Close
	return hung.Listener.Addr().String()
}

// TestHungInstanceEjected: an instance that accepts requests and never
// answers fails the attempt after the response-header timeout and is
// ejected at once, whatever the policy's errors (routedcall); the GET is
// retried on another instance.
func TestHungInstanceEjected(t *testing.T) { onStacks(t, testHungInstanceEjected) }

func testHungInstanceEjected(t *testing.T) {
	w := newWorld(t, "outlier: {errors: 5, window: 1m, ejection: 10m}\n", Config{ResponseHeaderTimeout: hungTimeout})
	good := newBackend(t, "good", "")
	w.register(t, "orders", good.id, good.addr, "")
	w.register(t, "orders", "hung", hungServer(t), "")
	svc := w.engine.Service("orders")
	start := time.Now()
	cut := 0 // requests that waited for the timeout: the hung instance took them
	for i := 0; ; i++ {
		d, err := svc.Resolve(routing.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(d.Eligible, " ") == "good" {
			break
		}
		if cut > 0 {
			t.Fatalf("the hung instance is still eligible after a request it took was cut: %v", d.Eligible)
		}
		began := time.Now()
		expectServed(t, w.get(t, fmt.Sprintf("/%d", i), nil), good.id, "")
		if time.Since(began) >= hungTimeout {
			cut++
		}
	}
	t.Logf("the hung instance was ejected %v after the first request", time.Since(start).Round(time.Millisecond))
}

// TestIdleUpstreamConnsClose: the gateway closes its idle connections to an
// instance after the upstream idle timeout, though no request comes again (the fast
// path's sweeper, net/http's transport), and the fast path then drops the
// instance's pool.
func TestIdleUpstreamConnsClose(t *testing.T) { onStacks(t, testIdleUpstreamConnsClose) }

func testIdleUpstreamConnsClose(t *testing.T) {
	const idle = 100 * time.Millisecond
	w := newWorld(t, "", Config{UpstreamIdleTimeout: idle})
	var opened, open atomic.Int64
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{id: "one", addr: l.Addr().String()}
	srv := &http.Server{Handler: b, ReadHeaderTimeout: 10 * time.Second,
		ConnState: func(_ net.Conn, s http.ConnState) {
			switch s {
			case http.StateNew:
				opened.Add(1)
				open.Add(1)
			case http.StateClosed, http.StateHijacked:
				open.Add(-1)
			}
		}}
	serveServer(t, l, srv)
	w.register(t, "orders", b.id, b.addr, "")
	for range 3 {
		expectServed(t, w.get(t, "/", nil), b.id, "")
	}
	if opened.Load() == 0 {
		t.Fatal("the backend saw no connection")
	}
	eventually(t, "the gateway to close its idle connections to the backend", func() bool { return open.Load() == 0 })
	if stackOf(t) == HTTP1Fast {
		eventually(t, "the fast path to drop the backend's pool", func() bool {
			return !fastOf(w.gw).up.Pooled(b.addr)
		})
	}
	// The instance serves again, on a new connection.
	expectServed(t, w.get(t, "/", nil), b.id, "")
}

// TestIdleClientConnClosed: a client's keep-alive connection that sends no
// next request is closed after the client idle timeout.
func TestIdleClientConnClosed(t *testing.T) { onStacks(t, testIdleClientConnClosed) }

func testIdleClientConnClosed(t *testing.T) {
	const idle = 100 * time.Millisecond
	w := newWorld(t, "", Config{ClientIdleTimeout: idle})
	b := newBackend(t, "one", "")
	w.register(t, "orders", b.id, b.addr, "")
	r := w.send(t, "GET / HTTP/1.1\r\nHost: orders\r\n\r\n")
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("got %d (close %v), want a 200 that keeps the connection", resp.StatusCode, resp.Close)
	}
	start := time.Now()
	// The read waits until the gateway closes the connection (EOF), or
	// fails when send's deadline passes.
	if n, err := r.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read %d bytes, %v; want the gateway to close the idle connection", n, err)
	}
	if d := time.Since(start); d < idle/2 {
		t.Errorf("closed %v after the answer, before the idle timeout (%v)", d, idle)
	}
}

// TestLaneFallbackHeader: a lane request served by another lane says why
// in X-Lane-Fallback: unknown_lane for a lane that exists nowhere,
// no_instance_in_lane for a known lane (here named by the policy) without
// an instance of the service; a request served in its lane has none.
func TestLaneFallbackHeader(t *testing.T) { onStacks(t, testLaneFallbackHeader) }

func testLaneFallbackHeader(t *testing.T) {
	w := newWorld(t, "lanes:\n  team-b: {fallback: [team-a]}\n", Config{})
	twoLanes(t, w)
	deadline := time.Now().Add(waitFor)
	for !w.engine.UnknownLane("bob") || !w.engine.KnownLane("team-a") {
		if time.Now().After(deadline) {
			t.Fatal("the registry's lanes and the policy's were not known in time")
		}
		time.Sleep(time.Millisecond)
	}
	for _, c := range []struct{ lane, served, fallback string }{
		{"bob", "baseline", "unknown_lane"},
		{"team-a", "baseline", "no_instance_in_lane"},
		{"team-b", "baseline", "no_instance_in_lane"},
		{"alice", "alice", ""},
		{"", "baseline", ""},
	} {
		h := map[string]string{}
		if c.lane != "" {
			h["x-lane"] = c.lane
		}
		r := w.get(t, "/", h)
		if r.status != http.StatusOK || r.header.Get(hLaneServed) != c.served || r.header.Get(hLaneFallback) != c.fallback {
			t.Errorf("x-lane %q: %d, served %q, fallback %q; want 200, %q, %q", c.lane, r.status, r.header.Get(hLaneServed), r.header.Get(hLaneFallback), c.served, c.fallback)
		}
	}
}
