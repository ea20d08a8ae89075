package gateway

import (
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/policy"
)

// Source is a lane-assignment source that Config.Disable can turn off. See
// the package documentation for the order in which they are read.
type Source string

// The sources that can be turned off.
const (
	// SourceHeaders is the x-lane header, the lane member of baggage and the
	// alias headers. The policy's gateway.lane_choice also limits it.
	SourceHeaders Source = "headers"
	// SourceCookie is the lane cookie (Config.LaneCookie).
	SourceCookie Source = "cookie"
	// SourceHost is the lane host <lane>.<Config.Domain>.
	SourceHost Source = "host"
	// SourcePolicyClients is the static client-address claims of the
	// policy (lanes.<lane>.clients).
	SourcePolicyClients Source = "policy-clients"
	// SourceClaims is the dynamic client-address claims (Config.Claims).
	SourceClaims Source = "claims"
)

// src is where the lane of a request came from, for metrics.
type src uint8

const (
	srcBaseline src = iota
	srcHeader
	srcBaggage
	srcAlias
	srcCookie
	srcHost
	srcPolicyClients
	srcClaims
	srcCanary
	nSrc
)

var srcNames = [nSrc]string{"baseline", "header", "baggage", "alias", "cookie", "host", "policy-clients", "claims", "canary"}

// policyView is the part of the policy the gateway reads on every request,
// compiled once per policy document.
type policyView struct {
	src    *policy.Policy
	choice string
	allow  []netip.Prefix
	claims []claim // most specific prefix first
}

type claim struct {
	prefix  netip.Prefix
	lane    string
	expires time.Time // zero: never
}

func compilePolicy(p *policy.Policy) *policyView {
	v := &policyView{src: p, choice: policy.ChoiceAll}
	if p == nil {
		return v
	}
	v.choice = p.Gateway.Choice()
	for _, a := range p.Gateway.Allow {
		if pf, ok := parseClient(a); ok {
			v.allow = append(v.allow, pf)
		}
	}
	for l, s := range p.Lanes {
		for _, c := range s.Clients {
			if pf, ok := parseClient(c); ok {
				cl := claim{prefix: pf, lane: l}
				if s.Expires != nil {
					cl.expires = *s.Expires
				}
				v.claims = append(v.claims, cl)
			}
		}
	}
	slices.SortFunc(v.claims, func(a, b claim) int {
		if a.prefix.Bits() != b.prefix.Bits() {
			return b.prefix.Bits() - a.prefix.Bits() // longer prefixes first
		}
		return strings.Compare(a.lane, b.lane)
	})
	return v
}

// parseClient reads an IP or a CIDR of the policy as a prefix.
func parseClient(s string) (netip.Prefix, bool) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, false
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		return p.Masked(), true
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, false
	}
	a = a.Unmap().WithZone("")
	return netip.PrefixFrom(a, a.BitLen()), true
}

// mayChoose reports whether client may choose its lane with headers.
func (v *policyView) mayChoose(client netip.Addr) bool {
	switch v.choice {
	case policy.ChoiceNone:
		return false
	case policy.ChoiceAllowlist:
		return client.IsValid() && contains(v.allow, client)
	}
	return true
}

// claimed returns the lane that the policy's clients give client.
func (v *policyView) claimed(client netip.Addr) (string, bool) {
	if !client.IsValid() {
		return "", false
	}
	for i := range v.claims {
		c := &v.claims[i]
		if c.prefix.Contains(client) && (c.expires.IsZero() || time.Now().Before(c.expires)) {
			return c.lane, true
		}
	}
	return "", false
}

func contains(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// peerAddr returns the address of the direct peer of r.
func peerAddr(r *http.Request) netip.Addr {
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		return ap.Addr().Unmap().WithZone("")
	}
	if a, err := netip.ParseAddr(r.RemoteAddr); err == nil {
		return a.Unmap().WithZone("")
	}
	return netip.Addr{}
}

// clientAddr returns the client address of r and whether the direct peer is
// a trusted proxy. X-Forwarded-For is read only from a trusted peer: walking
// from the right, trusted addresses are skipped and the first untrusted one is
// the client. If every address is trusted, the left-most is. An entry that is
// not an address stops the walk at the last good one.
func (g *Gateway) clientAddr(r *http.Request) (client netip.Addr, trustedPeer bool) {
	peer := peerAddr(r)
	if !peer.IsValid() || !contains(g.trusted, peer) {
		return peer, false
	}
	client = peer
	xff := r.Header["X-Forwarded-For"]
	for i := len(xff) - 1; i >= 0; i-- {
		v := xff[i]
		for v != "" {
			item := v
			if j := strings.LastIndexByte(v, ','); j >= 0 {
				item, v = v[j+1:], v[:j]
			} else {
				v = ""
			}
			item = strings.TrimSpace(item)
			if item == "" {
				continue
			}
			a, ok := parseForwarded(item)
			if !ok {
				return client, true
			}
			client = a
			if !contains(g.trusted, a) {
				return client, true
			}
		}
	}
	return client, true
}

// parseForwarded reads one X-Forwarded-For entry: an IP, or an IP with a
// port ("1.2.3.4:5", "[::1]:5").
func parseForwarded(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return a.Unmap().WithZone(""), true
		}
	}
	return netip.Addr{}, false
}

// cookie returns the value of the named cookie in h without parsing the
// other cookies or allocating. Surrounding double quotes are removed.
func cookie(h http.Header, name string) (string, bool) {
	for _, line := range h["Cookie"] {
		for line != "" {
			var part string
			part, line, _ = strings.Cut(line, ";")
			k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
			if !ok || strings.TrimSpace(k) != name {
				continue
			}
			v = strings.TrimSpace(v)
			if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
				v = v[1 : len(v)-1]
			}
			return v, true
		}
	}
	return "", false
}

// hostOnly returns the host of a Host header without its port.
func hostOnly(h string) string {
	if strings.HasPrefix(h, "[") {
		if i := strings.IndexByte(h, ']'); i > 0 {
			return h[1:i]
		}
		return h
	}
	if i := strings.IndexByte(h, ':'); i >= 0 && strings.IndexByte(h[i+1:], ':') < 0 {
		return h[:i]
	}
	return h
}

// splitLaneHost splits a lane host <label>.<rest> under the gateway's domain.
// ok is false when host is not a lane host: no domain is configured, host is
// not under it, or host is itself the host of a route.
func (g *Gateway) splitLaneHost(host string) (label, rest string, ok bool) {
	d := g.domain
	if d == "" || len(host) <= len(d)+1 || !strings.EqualFold(host[len(host)-len(d):], d) || host[len(host)-len(d)-1] != '.' {
		return "", "", false
	}
	for i := range g.routes {
		if h := g.routes[i].Host; h != "" && strings.EqualFold(h, host) {
			return "", "", false
		}
	}
	i := strings.IndexByte(host, '.')
	return host[:i], host[i+1:], true
}

// badLane is an invalid lane read from a source, for the 400 answer.
type badLane struct {
	source string // for example `header "x-lane"`, `cookie "lane"`
	value  string
	rule   lane.Rule
}

// ruleText explains a rule of the lane-name grammar.
func ruleText(r lane.Rule) string {
	switch r {
	case lane.RuleEmpty:
		return "a lane name must not be empty"
	case lane.RuleTooLong:
		return "a lane name has at most 63 characters"
	case lane.RuleChars:
		return "a lane name has only a-z, 0-9 and '-'"
	default:
		return "a lane name starts and ends with a letter or digit"
	}
}
