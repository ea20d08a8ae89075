package gateway

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// clientSourceCases are the client-controlled lane sources, each with a
// request that selects lane alice through it alone.
var clientSourceCases = []struct {
	source Source
	header map[string]string
}{
	{SourceHeader, map[string]string{"x-lane": "alice"}},
	{SourceBaggage, map[string]string{"baggage": "lane=alice,k=v"}},
	{SourceAlias, map[string]string{"x-tag": "alice"}},
	{SourceCookie, map[string]string{"cookie": "lane=alice"}},
	{SourceHost, map[string]string{"host": "alice.lanes.localhost"}},
}

// TestLaneChoiceGovernsEverySource checks that gateway.lane_choice decides
// for every source a client controls: with none, no client selects a lane
// through any of them; with an allowlist, only the listed clients do. An
// invalid value in a source that is not read is no error.
func TestLaneChoiceGovernsEverySource(t *testing.T) { onStacks(t, testLaneChoiceGovernsEverySource) }

func testLaneChoiceGovernsEverySource(t *testing.T) {
	for _, choice := range []struct {
		name, doc string
		allowed   string // a client that may choose ("" for none)
		denied    string
	}{
		{"none", "gateway: {lane_choice: none}\n", "", "127.0.0.1"},
		{"allowlist", "gateway: {lane_choice: allowlist, allow: [127.0.0.11/32]}\n", "127.0.0.11", "127.0.0.12"},
	} {
		t.Run(choice.name, func(t *testing.T) {
			w := newWorld(t, choice.doc, Config{Domain: "lanes.localhost", Aliases: []string{"x-tag"}})
			twoLanes(t, w)
			denied := clientFrom(t, choice.denied)
			for _, c := range clientSourceCases {
				t.Run(string(c.source), func(t *testing.T) {
					r := do(t, denied, "GET", w.url+"/", c.header)
					expectServed(t, r, "base", "")
					for _, k := range []string{"x-lane", "x-tag"} {
						if got := r.echo.hdr(t, k); got != "" {
							t.Errorf("upstream %s = %q from a client that may not choose", k, got)
						}
					}
					if got := r.echo.hdr(t, "baggage"); strings.Contains(got, "lane=") {
						t.Errorf("upstream baggage = %q from a client that may not choose", got)
					}
					bad := map[string]string{}
					for k, v := range c.header {
						bad[k] = strings.Replace(v, "alice", "-bad-", 1)
					}
					expectServed(t, do(t, denied, "GET", w.url+"/", bad), "base", "")
					if choice.allowed != "" {
						expectServed(t, do(t, clientFrom(t, choice.allowed), "GET", w.url+"/", c.header), "alice-1", "alice")
					}
				})
			}
		})
	}
}

// TestClaimsKeepTheirOwnRule checks that client-address claims, set by
// operators, select a lane whatever gateway.lane_choice says.
func TestClaimsKeepTheirOwnRule(t *testing.T) { onStacks(t, testClaimsKeepTheirOwnRule) }

func testClaimsKeepTheirOwnRule(t *testing.T) {
	w := newWorld(t, `
gateway: {lane_choice: none}
lanes:
  alice: {clients: ["127.0.0.13"]}
`, Config{Claims: func(a netip.Addr) (string, bool) { return "alice", a == netip.MustParseAddr("127.0.0.14") }})
	twoLanes(t, w)
	expectServed(t, do(t, clientFrom(t, "127.0.0.13"), "GET", w.url+"/", nil), "alice-1", "alice")
	expectServed(t, do(t, clientFrom(t, "127.0.0.14"), "GET", w.url+"/", nil), "alice-1", "alice")
	expectServed(t, do(t, clientFrom(t, "127.0.0.15"), "GET", w.url+"/", map[string]string{"x-lane": "alice"}), "base", "")
}

// TestDisableEachSource turns each client-controlled source off on its own:
// that source no longer selects a lane, and the others still do.
func TestDisableEachSource(t *testing.T) { onStacks(t, testDisableEachSource) }

func testDisableEachSource(t *testing.T) {
	for _, off := range clientSourceCases {
		t.Run(string(off.source), func(t *testing.T) {
			w := newWorld(t, "", Config{Domain: "lanes.localhost", Aliases: []string{"x-tag"}, Disable: []Source{off.source}})
			twoLanes(t, w)
			for _, c := range clientSourceCases {
				r := w.get(t, "/", c.header)
				if c.source == off.source {
					expectServed(t, r, "base", "")
					if got := r.echo.hdr(t, "x-lane"); got != "" {
						t.Errorf("%s off: upstream x-lane = %q", off.source, got)
					}
					continue
				}
				expectServed(t, r, "alice-1", "alice")
			}
		})
	}
}

// TestLookalikeLaneHeadersStripped checks that header spellings which a
// proxy or framework upstream may merge with x-lane (x_lane: CGI's
// HTTP_X_LANE, nginx with underscores_in_headers) never go upstream, nor do
// those of the alias headers, whether or not the client may choose.
func TestLookalikeLaneHeadersStripped(t *testing.T) { onStacks(t, testLookalikeLaneHeadersStripped) }

func testLookalikeLaneHeadersStripped(t *testing.T) {
	for _, doc := range []string{"", "gateway: {lane_choice: none}\n"} {
		w := newWorld(t, doc, Config{Aliases: []string{"x-asm-prefer-tag"}})
		twoLanes(t, w)
		req, err := http.NewRequest("GET", w.url+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header["x_lane"] = []string{"alice"}
		req.Header["X_Lane"] = []string{"alice"}
		req.Header["x-asm_prefer_tag"] = []string{"alice"}
		req.Header["x_other"] = []string{"kept"}
		r := doReq(t, w.client, req)
		expectServed(t, r, "base", "")
		for k := range r.echo.Header {
			if f := strings.ToLower(strings.ReplaceAll(k, "_", "-")); f == "x-lane" || f == "x-asm-prefer-tag" {
				t.Errorf("policy %q: header %q went upstream", doc, k)
			}
		}
		if got := http.Header(r.echo.Header).Values("X_other"); len(got) != 1 {
			t.Errorf("an unrelated header with an underscore was not kept: %q", r.echo.Header)
		}
	}
}

// TestRealIP checks that X-Real-IP upstream is the client address the
// gateway decided, never one a client sent.
func TestRealIP(t *testing.T) { onStacks(t, testRealIP) }

func testRealIP(t *testing.T) {
	w := newWorld(t, "", Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.16/32")}})
	twoLanes(t, w)
	r := do(t, clientFrom(t, "127.0.0.17"), "GET", w.url+"/", map[string]string{"x-real-ip": "10.9.9.9", "x-forwarded-for": "10.9.9.9"})
	if got := r.echo.hdr(t, "x-real-ip"); got != "127.0.0.17" {
		t.Errorf("untrusted peer: upstream x-real-ip = %q, want 127.0.0.17", got)
	}
	r = do(t, clientFrom(t, "127.0.0.16"), "GET", w.url+"/", map[string]string{"x-real-ip": "10.9.9.9", "x-forwarded-for": "192.0.2.7"})
	if got := r.echo.hdr(t, "x-real-ip"); got != "192.0.2.7" {
		t.Errorf("trusted proxy: upstream x-real-ip = %q, want 192.0.2.7", got)
	}
}
