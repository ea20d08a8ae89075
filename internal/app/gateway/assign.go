package gateway

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/policy"
)

// Source names a lane-assignment source, as [Config.Disable] and the
// lanes_gateway_requests_total metric spell it. See the package
// documentation for the order in which they are read.
type Source string

// The sources that can be turned off.
const (
	// SourceHeader is the x-lane header.
	SourceHeader Source = "header"
	// SourceBaggage is the lane member of the W3C baggage header.
	SourceBaggage Source = "baggage"
	// SourceAlias is the alias headers (Config.Aliases).
	SourceAlias Source = "alias"
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

var srcNames = [nSrc]string{"baseline", string(SourceHeader), string(SourceBaggage), string(SourceAlias),

	string(SourceCookie), string(SourceHost), string(SourcePolicyClients), string(SourceClaims), "canary"}

// A sourceSet is a set of lane sources.
type sourceSet uint16

func (s sourceSet) has(x src) bool { return s&(1<<x) != 0 }

const (
	// clientSources are the sources that a client controls: what it sends
	// decides them. The policy's gateway.lane_choice governs them together.
	clientSources sourceSet = 1<<srcHeader | 1<<srcBaggage | 1<<srcAlias | 1<<srcCookie | 1<<srcHost
	// operatorSources are set by operators, for client addresses: they keep
	// their own rules (a claim is only as good as Config.TrustedProxies).
	operatorSources sourceSet = 1<<srcPolicyClients | 1<<srcClaims
	allSources                = clientSources | operatorSources
)

// parseSources returns the sources left on by disable. Errors name the
// entry of disable.
func parseSources(disable []Source) (sourceSet, error) {
	on := allSources
	for i, s := range disable {
		x := srcBaseline
		for j := srcHeader; j < srcCanary; j++ {
			if srcNames[j] == string(s) {
				x = j
			}
		}
		if x == srcBaseline {
			return 0, fieldError("disable", i, "unknown source %q: want %s", s, sourceList())
		}
		on &^= 1 << x
	}
	return on, nil
}

// sourceList lists the sources that can be turned off, for messages.
func sourceList() string {
	names := srcNames[srcHeader:srcCanary]
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// readable returns the sources read for a request from client: the sources
// that the configuration leaves on, less every client-controlled one when
// the policy's gateway.lane_choice does not let client choose. This is the
// one place where lane_choice applies.
func (g *Gateway) readable(v *policyView, client netip.Addr) sourceSet {
	if v.mayChoose(client) {
		return g.on
	}
	return g.on &^ clientSources
}

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

// mayChoose reports whether client may choose its lane with what it sends
// (headers, cookie, host).
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

// clientAddr returns the client address of r and whether the direct peer is
// a trusted proxy. X-Forwarded-For is read only from a trusted peer: walking
// from the right, trusted addresses are skipped and the first untrusted one is
// the client. If every address is trusted, the left-most is. An entry that is
// not an address stops the walk at the last good one.
func (g *Gateway) clientAddr(in inbound) (client netip.Addr, trustedPeer bool) {
	peer := in.peer()
	if !peer.IsValid() || !contains(g.trusted, peer) {
		return peer, false
	}
	client = peer
	xff := in.Values(hXFF)
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

// cookie returns the value of the named cookie in the Cookie header lines
// without parsing the other cookies or allocating. Surrounding double quotes
// are removed.
func cookie(lines []string, name string) (string, bool) {
	for _, line := range lines {
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

// assign decides the lane of r. See the package documentation for the order
// of the sources.
func (g *Gateway) assign(in inbound, st *reqState, label string, laneHost bool) (string, src, *badLane) {
	v := g.policyView()
	client, trusted := g.clientAddr(in)
	st.client, st.trusted = client, trusted
	on := g.readable(v, client)

	// 1. Headers: x-lane, baggage, aliases.
	if on&(1<<srcHeader|1<<srcBaggage|1<<srcAlias) != 0 {
		name, from, err := g.extract(in, on, st)
		if err != nil {
			ne := nameError(err)
			what := fmt.Sprintf("header %q", from)
			if from == lane.BaggageHeader {
				what = fmt.Sprintf("the %q member of header %q", lane.BaggageKey, lane.BaggageHeader)
			}
			return "", 0, &badLane{source: what, value: ne.Value, rule: ne.Rule}
		}
		if name != "" {
			switch from {
			case lane.Header:
				return name, srcHeader, nil
			case lane.BaggageHeader:
				return name, srcBaggage, nil
			default:
				return name, srcAlias, nil
			}
		}
	}
	// 2. The lane cookie.
	if on.has(srcCookie) {
		if raw, ok := cookie(in.Values("Cookie"), g.laneCookie); ok && strings.TrimSpace(raw) != "" {
			name, err := lane.Parse(raw)
			if err != nil {
				return "", 0, &badLane{source: fmt.Sprintf("cookie %q", g.laneCookie), value: raw, rule: nameError(err).Rule}
			}
			return name, srcCookie, nil
		}
	}
	// 3. The lane host.
	if laneHost && on.has(srcHost) {
		name, err := lane.Parse(label)
		if err != nil {
			return "", 0, &badLane{source: fmt.Sprintf("host %q", hostOnly(in.hostHeader())), value: label, rule: nameError(err).Rule}
		}
		return name, srcHost, nil
	}
	// 4. Client-address claims: the policy's, then the dynamic ones.
	if client.IsValid() {
		if on.has(srcPolicyClients) {
			if name, ok := v.claimed(client); ok {
				return name, srcPolicyClients, nil
			}
		}
		if on.has(srcClaims) && g.claims != nil {
			if raw, ok := g.claims(client); ok && raw != "" {
				name, err := lane.Parse(raw)
				if err != nil {
					g.log.Warn("lanes gateway: a dynamic claim holds an invalid lane", "client", client, "lane", raw, "err", err)
					return "", 0, &badLane{source: fmt.Sprintf("the claim of client %s", client), value: raw, rule: nameError(err).Rule}
				}
				return name, srcClaims, nil
			}
		}
	}
	// 5. The baseline, which the engine may split to a canary.
	return "", srcBaseline, nil
}

// extract reads the lane headers of the sources in on with the lane
// propagator, which owns their rules (order, baggage, aliases).
func (g *Gateway) extract(in inbound, on sourceSet, st *reqState) (name, from string, err error) {
	p := g.prop
	if !on.has(srcAlias) {
		p = lane.Propagator{}
	}
	if on.has(srcHeader) && on.has(srcBaggage) {
		return p.Extract(in)
	}
	st.hdr = headerView{h: in, hide: allSources &^ on}
	return p.Extract(&st.hdr)
}

// headerView is the view of a request's headers that the lane propagator
// reads when the x-lane or the baggage source is off: their headers are
// hidden. It is only read.
type headerView struct {
	h    lane.Carrier
	hide sourceSet
}

func (v *headerView) hidden(key string) bool {
	return v.hide.has(srcHeader) && strings.EqualFold(key, lane.Header) ||
		v.hide.has(srcBaggage) && strings.EqualFold(key, lane.BaggageHeader)
}

func (v *headerView) Get(key string) string {
	if vals := v.Values(key); len(vals) > 0 {
		return vals[0]
	}
	return ""
}

func (v *headerView) Values(key string) []string {
	if v.hidden(key) {
		return nil
	}
	return v.h.Values(key)
}

func (v *headerView) Set(key, value string) {}

func (v *headerView) Del(key string) {}

// forward sets the forwarding headers of the outbound request out, made
// from in: the X-Forwarded-For chain of a trusted proxy is kept (any other is
// dropped) and the peer appended; X-Forwarded-Host and X-Forwarded-Proto are
// a trusted proxy's, else the gateway's (the request's host, and "http", or
// "https" when the client spoke TLS); X-Real-IP is the client address that
// the gateway decided. The Forwarded header is dropped. out starts as a copy
// of in's headers or without any of these.
func (g *Gateway) forward(out fields, in inbound, st *reqState, https bool) {
	b := st.buf[:0]
	if st.trusted {
		for _, v := range in.Values(hXFF) {
			b = append(b, v...)
			b = append(b, ", "...)
		}
	}
	if peer := in.peer(); peer.IsValid() {
		b = peer.AppendTo(b)
		out.setBytes(hXFF, b)
	} else {
		out.Del(hXFF)
	}
	// The client's own X-Forwarded-Host and -Proto are read only from a
	// trusted peer (most requests come from one that is not).
	if v := trustedValues(in, st, hXFHost); len(v) > 0 {
		out.setVals(hXFHost, v)
	} else {
		out.Set(hXFHost, in.hostHeader())
	}
	if v := trustedValues(in, st, hXFProto); len(v) > 0 {
		out.setVals(hXFProto, v)
	} else if https {
		out.setVals(hXFProto, protoHTTPS)
	} else {
		out.setVals(hXFProto, protoHTTP)
	}
	out.Del("Forwarded")
	if st.client.IsValid() {
		b = st.client.AppendTo(b[:0])
		out.setBytes(hRealIP, b)
	} else {
		out.Del(hRealIP)
	}
	st.buf = b[:0]
}

// trustedValues returns the values of the header key of in when its peer
// is trusted, else none.
func trustedValues(in inbound, st *reqState, key string) []string {
	if !st.trusted {
		return nil
	}
	return in.Values(key)
}

var (
	protoHTTP  = []string{"http"}[:1:1]
	protoHTTPS = []string{"https"}[:1:1]
)

// strippedName reports whether the header named k is one that
// stripLaneHeaders removes.
func (g *Gateway) strippedName(k string) bool {
	for _, name := range g.stripped {
		if lookalike(k, name) {
			return true
		}
	}
	return false
}

// lookalike reports whether header name k equals name when case is ignored
// and '_' counts as '-'.
func lookalike(k, name string) bool {
	if len(k) != len(name) {
		return false
	}
	for i := 0; i < len(k); i++ {
		if foldHeaderByte(k[i]) != foldHeaderByte(name[i]) {
			return false
		}
	}
	return true
}

// foldHeaderByte maps c to lower case, and '_' to '-'.
func foldHeaderByte(c byte) byte {
	switch {
	case c == '_':
		return '-'
	case 'A' <= c && c <= 'Z':
		return c + 'a' - 'A'
	}
	return c
}

// nameError is the *lane.NameError of err, an error of lane.Parse or of
// the lane propagator; an error of another kind, which they do not return,
// is read as one of the rule "characters" with no value.
func nameError(err error) *lane.NameError {
	if ne, ok := errors.AsType[*lane.NameError](err); ok {
		return ne
	}
	return &lane.NameError{Rule: lane.RuleChars}
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
		return fmt.Sprintf("a lane name has at most %d characters", lane.MaxLen)
	case lane.RuleChars:
		return "a lane name has only a-z, 0-9 and '-'"
	default:
		return "a lane name starts and ends with a letter or digit"
	}
}
