// Package oracle is the reference model of the lane routing contract
// (docs/routing.md) and the randomized differential tests that hold every
// data path to it.
//
// The model is written from the contract's text and shares no code with the
// routing engine: no snapshot, no lane table, no sub-groups, no precomputed
// routes. It is a plain function of the fleet, the policy, the outlier
// history, the caller and the request, recomputed from scratch for every
// request, and each rule of the contract is a few commented lines of it. It
// is slow on purpose: obviously right matters here, fast does not.
//
// The generator (Generate) makes random fleets, policies and sequences of
// requests, outcome reports and clock steps as scenario files; Check replays
// one through a data path (the engine, as `lanes simulate` does) and through
// the model and returns the first step where they disagree; Shrink cuts a
// disagreeing scenario down to a minimal one, and Print writes it in the
// scenario format with the model's answers as its expectations, ready to keep
// as a regression case.
package oracle

import (
	"slices"
	"strings"
	"time"

	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

// Request is one request as a scenario step sends it.
type Request struct {
	Service string
	Lane    string // the raw header value, as received
	Zone    string // the caller's zone
	Host    string // the caller's host
	Key     string // the request key of sticky canary splits
}

// Answer is the contract's answer to one request: the eligible set and the
// lane that serves it, or an error code.
type Answer struct {
	Eligible    []string // instance ids, sorted; nil with Error
	Lane        string   // the serving lane; "" is the baseline
	RequestLane string   // the lane the request carries downstream
	Reason      string   // lane, fallback, lane-empty, baseline, invalid-lane, canary, probe, panic
	Error       string   // no_instance, lane_unavailable, or ""
	// Problem is what a data path found wrong in its own answer (a pick
	// outside the eligible set it answered); the model never has one.
	Problem string
	// Retries are the answers to the retries of the request after it
	// failed on the first k instances of Eligible, for k from 1 to all of
	// them (for an answer that is no error and no probe), one after the
	// other: the model's eligible sets, or the one instance a data path
	// picked.
	Retries []Answer
}

// RetrySets are the sets of failed instances that the retries of an answer
// are asked for: the first k of its eligible set, k from 1 to all.
func (a Answer) RetrySets() [][]string {
	if a.Error != "" || a.Reason == "probe" {
		return nil
	}
	var out [][]string
	for k := 1; k <= len(a.Eligible); k++ {
		out = append(out, a.Eligible[:k])
	}
	return out
}

// Model is the routing contract as a state machine over virtual time: the
// fleet and the policy are fixed; requests and reports move the outlier
// state of the instances.
type Model struct {
	pol    *policy.Policy
	out    policy.Outlier // with the defaults
	insts  []registry.Instance
	health map[string]*health // by service + "/" + id
	now    time.Time

	// For the retry of a call (ResolveWithout): the instances that failed
	// it, which count as absent; and dry, which sends no probe.
	absent []string
	dry    bool
}

// New returns the model of a fleet under a policy (nil for the empty
// policy), with its clock at start.
func New(p *policy.Policy, insts []registry.Instance, start time.Time) *Model {
	if p == nil {
		p = &policy.Policy{}
	}
	m := &Model{pol: p, insts: insts, health: map[string]*health{}, now: start}
	// "defaults apply when absent": 5 errors in 30s eject for 30s.
	m.out = policy.Outlier{Errors: 5, Window: policy.Duration(30 * time.Second), Ejection: policy.Duration(30 * time.Second)}
	if o := p.Outlier; o.Errors != 0 {
		m.out.Errors = o.Errors
	}
	if o := p.Outlier; o.Window != 0 {
		m.out.Window = o.Window
	}
	if o := p.Outlier; o.Ejection != 0 {
		m.out.Ejection = o.Ejection
	}
	return m
}

// At moves the model's clock to t (never back).
func (m *Model) At(t time.Time) {
	if t.After(m.now) {
		m.now = t
	}
}

func (m *Model) healthOf(service, id string) *health {
	k := service + "/" + id
	h := m.health[k]
	if h == nil {
		h = &health{}
		m.health[k] = h
	}
	h.settle(m.now, m.out)
	return h
}

// Report feeds the outcome of one call to the instance id of service.
func (m *Model) Report(service, id string, ok bool) {
	if !slices.ContainsFunc(m.insts, func(in registry.Instance) bool { return in.Service == service && in.ID == id }) {
		return // an unknown instance: nothing to record
	}
	m.healthOf(service, id).report(ok, m.now, m.out)
}

// The outlier states of an instance (routing.md, "Outlier detection").
const (
	healthy  = "healthy"
	ejected  = "ejected"
	halfOpen = "half-open"
	probing  = "probing"
)

type health struct {
	state    string      // "" is healthy
	failures []time.Time // healthy: the failures still in the window
	until    time.Time   // ejected: when the ejection ends; probing: when the probe is given up
}

func (h *health) is(state string) bool {
	return h.state == state || h.state == "" && state == healthy
}

// settle applies the transitions that time alone makes, up to now.
func (h *health) settle(now time.Time, o policy.Outlier) {
	// "A probe that is never reported within one ejection counts as failed":
	// it fails at its deadline, and the new ejection runs from then.
	if h.is(probing) && !now.Before(h.until) {
		h.state, h.until = ejected, h.until.Add(o.Ejection.D())
	}
	// "After ejection has passed it is half-open."
	if h.is(ejected) && !now.Before(h.until) {
		h.state = halfOpen
	}
}

func (h *health) report(ok bool, now time.Time, o policy.Outlier) {
	switch {
	case h.is(healthy) && !ok:
		// "When an instance has errors failures within the sliding window,
		// it is ejected." The window is the last `window` up to now: a
		// failure exactly `window` old has left it. Successes do not reset it.
		kept := h.failures[:0]
		for _, f := range h.failures {
			if now.Sub(f) < o.Window.D() {
				kept = append(kept, f)
			}
		}
		h.failures = append(kept, now)
		if len(h.failures) >= o.Errors {
			h.state, h.until, h.failures = ejected, now.Add(o.Ejection.D()), nil
		}
	case h.is(probing) && ok:
		// "A successful probe restores the instance (its error history is
		// cleared)."
		h.state, h.failures = healthy, nil
	case h.is(probing) && !ok:
		// "A failed probe ejects it again for another ejection."
		h.state, h.until = ejected, now.Add(o.Ejection.D())
	}
	// Outcomes for an ejected or half-open instance come from calls sent
	// before the ejection: they are ignored. A success of a healthy one
	// changes nothing.
}

// candidate is one instance that may serve a call to its service before the
// lane rules: not draining, and not in an expired lane.
type candidate struct {
	in   registry.Instance
	lane string // its lane after the dynamic tag rules
	h    *health
	// absent: it failed the call that this request retries
	// (ResolveWithout), and counts as absent for it.
	absent bool
}

// Resolve answers req as the contract says, and sends it: a request that
// probes a half-open instance leaves that probe in flight.
func (m *Model) Resolve(req Request) Answer {
	// "For a call to service S, start from S's instances, less those with
	// weight 0 (draining) and those ejected by outlier detection." Ejection
	// is applied per lane below, as panic mode brings ejected baseline
	// instances back. An expired lane takes no traffic: its instances are
	// left out as if gone.
	var cands []candidate
	for _, in := range m.insts {
		if in.Service != req.Service || in.Drain {
			continue
		}
		l := m.laneOf(in)
		if e := m.pol.Lanes[l].Expires; l != "" && e != nil && !m.now.Before(*e) {
			continue
		}
		cands = append(cands, candidate{in: in, lane: l, h: m.healthOf(in.Service, in.ID), absent: slices.Contains(m.absent, in.ID)})
	}

	raw := strings.Trim(req.Lane, " \t")
	if raw == "" {
		// No lane: a baseline request.
		return m.baselineRequest(req, cands, "baseline")
	}
	l, ok := laneName(raw)
	if !ok {
		// "Inside the mesh an invalid value is ignored: the request is a
		// baseline request in every respect (a canary split included)."
		return m.baselineRequest(req, cands, "invalid-lane")
	}
	// "A request that already carries a lane is never split."
	// Rule 2, the lane chain: L, then L's fallback list, then the baseline;
	// the first lane of the chain with an instance serves. Rule 4: no other
	// lane is ever tried.
	chain, strict := m.chain(l)
	for i, c := range chain {
		if avail := available(cands, c); len(avail) > 0 {
			reason := "lane"
			if i > 0 {
				reason = "fallback"
			}
			return m.serve(req, avail, c, l, reason, false)
		}
	}
	if strict {
		// "If L (or a lane in the chain) is strict, the chain stops there:
		// the call fails with lane_unavailable."
		return Answer{Error: "lane_unavailable"}
	}
	return m.baseline(req, cands, l, "lane-empty")
}

// ResolveWithout answers the retry of req, a call that failed on the
// instances failed ("Retries follow the chain", docs/routing.md): for this
// answer only, they count as absent, as if not registered, and every rule
// applies as usual to the rest: the lane while it has another instance,
// then its chain; canaries, locality and probes. A lane request that so
// leaves the lane that would have served it, where that lane had an
// instance ready, is answered with the reason failover.
func (m *Model) ResolveWithout(req Request, failed []string) Answer {
	m.dry = true
	would := m.Resolve(req)
	m.dry, m.absent = false, failed
	a := m.Resolve(req)
	m.absent = nil
	_, valid := laneName(strings.Trim(req.Lane, " \t"))
	if valid && would.Error == "" && a.Error == "" && a.Lane != would.Lane && a.Reason != "probe" && m.ready(req.Service, would) {
		a.Reason = "failover"
	}
	return a
}

// ready reports whether the lane that answer a says serves a request of
// service had an instance ready for it: a healthy one, or any baseline one
// in panic mode.
func (m *Model) ready(service string, a Answer) bool {
	if a.Reason == "panic" {
		return true
	}
	for _, in := range m.insts {
		if in.Service == service && !in.Drain && m.laneOf(in) == a.Lane && m.healthOf(service, in.ID).is(healthy) {
			return true
		}
	}
	return false
}

// baselineRequest routes a request without a (valid) lane: a canary split,
// else the baseline.
func (m *Model) baselineRequest(req Request, cands []candidate, reason string) Answer {
	// Rule 6: a canary rule sends percent% of S's baseline requests to lane
	// C, when C has instances of S. The rules of a service split the key
	// space (10,000 buckets) in the order written; a rule whose lane has no
	// instance takes no share, and its requests stay in the baseline.
	if req.Key != "" {
		b, from := bucket(req.Key), uint64(0)
		for _, c := range m.pol.Canary {
			if c.Service != req.Service {
				continue
			}
			to := from + uint64(c.Percent*100+0.5)
			if b >= from && b < to {
				if avail := available(cands, c.Lane); len(avail) > 0 {
					// The lane chosen by a split travels downstream.
					return m.serve(req, avail, c.Lane, c.Lane, "canary", false)
				}
				break
			}
			from = to
		}
	}
	return m.baseline(req, cands, "", reason)
}

// baseline serves a request from the baseline, for a request that carries
// requestLane.
func (m *Model) baseline(req Request, cands []candidate, requestLane, reason string) Answer {
	// Rule 3: baseline instances only, never a lane's.
	if avail := available(cands, ""); len(avail) > 0 {
		return m.serve(req, avail, "", requestLane, reason, false)
	}
	// "The baseline is never emptied by ejection: if every baseline instance
	// of S is ejected, all of them are eligible again (panic mode)", as if
	// healthy. An instance whose probe is in flight stays out, unless
	// nothing else is left. Panic mode is the baseline's, not one call's:
	// when the instances a retried call failed were the baseline's last
	// healthy ones, the retry has none ("no_instance when all of them
	// failed"); in panic mode, the retry goes to the others.
	var all, notProbing []candidate
	for _, c := range cands {
		if c.lane == "" {
			if c.absent && (c.h.is(healthy) || c.h.is(halfOpen)) {
				return Answer{Error: "no_instance"}
			}
			all = append(all, c)
			if !c.h.is(probing) {
				notProbing = append(notProbing, c)
			}
		}
	}
	pool := all
	if len(notProbing) > 0 {
		pool = notProbing
	}
	if pool = where(pool, func(c candidate) bool { return !c.absent }); len(pool) > 0 {
		return m.serve(req, pool, "", requestLane, "panic", true)
	}
	// "For a baseline request: S has no baseline instance": no_instance; a
	// lane request whose chain ends here fails the same way.
	return Answer{Error: "no_instance"}
}

// serve answers from the instances of the serving lane that may take the
// request (pool), after locality and probes.
func (m *Model) serve(req Request, pool []candidate, lane, requestLane, reason string, panic bool) Answer {
	// Rule 5, locality, within the serving lane: the caller's host first
	// (when the policy turns it on), else the caller's zone, each only when
	// one of the lane's instances is there.
	if on := where(pool, func(c candidate) bool { return c.in.Host == req.Host }); m.pol.Locality.Host && req.Host != "" && len(on) > 0 {
		pool = on
	} else if in := where(pool, func(c candidate) bool { return c.in.Zone == req.Zone }); req.Zone != "" && len(in) > 0 {
		pool = in
	}
	a := Answer{Lane: lane, RequestLane: requestLane, Reason: reason}
	if !panic {
		// "After ejection has passed it is half-open: the next request whose
		// eligible set would contain it is sent to it alone, as a probe.
		// While that probe is in flight, the instance is not eligible for
		// other requests." Of several, the lowest id.
		for _, c := range pool {
			if c.h.is(halfOpen) {
				if !m.dry {
					c.h.state, c.h.until = probing, m.now.Add(m.out.Ejection.D())
				}
				a.Eligible, a.Reason = []string{c.in.ID}, "probe"
				return a
			}
		}
	}
	for _, c := range pool {
		if panic || c.h.is(healthy) {
			a.Eligible = append(a.Eligible, c.in.ID)
		}
	}
	slices.Sort(a.Eligible)
	return a
}

// available returns the candidates in lane l that count as its instances:
// healthy or half-open ("a lane whose instances are all ejected counts as
// having none"; a probing one is not eligible for other requests).
func available(cands []candidate, l string) []candidate {
	return where(cands, func(c candidate) bool { return c.lane == l && !c.absent && (c.h.is(healthy) || c.h.is(halfOpen)) })
}

func where(cands []candidate, keep func(candidate) bool) []candidate {
	var out []candidate
	for _, c := range cands {
		if keep(c) {
			out = append(out, c)
		}
	}
	// In id order, so that "the lowest id" means the same everywhere.
	slices.SortFunc(out, func(a, b candidate) int { return strings.Compare(a.in.ID, b.in.ID) })
	return out
}

// laneOf is rule 1: "An instance's lane is the lane given by the first
// enabled dynamic tags rule that matches it; if none matches, its own
// registered lane." A rule applies only where the credential that
// registered the instance may register (its scope): any lane for an
// unrestricted one, its own lane for a lane token's, none for a baseline
// token's (docs/routing.md).
func (m *Model) laneOf(in registry.Instance) string {
	for _, t := range m.pol.Tags {
		if t.Service != in.Service || t.Enabled != nil && !*t.Enabled {
			continue
		}
		if in.Scope != "" && in.Scope != t.Lane {
			continue
		}
		if matchesTag(t, in) {
			return t.Lane
		}
	}
	return in.Lane
}

// matchesTag: addrs are host:port, or *:port for any host; labels must all
// match.
func matchesTag(t policy.TagRule, in registry.Instance) bool {
	if len(t.Addrs) > 0 {
		_, port, _ := strings.Cut(in.Addr[strings.LastIndex(in.Addr, "]")+1:], ":")
		for _, a := range t.Addrs {
			if a == in.Addr || strings.HasPrefix(a, "*:") && a[2:] == port {
				return true
			}
		}
		return false
	}
	for k, v := range t.Labels {
		if got, ok := in.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// chain is L's lane chain: L, then the lanes of L's fallback list in order
// (not theirs: fallbacks are not transitive), stopping at the first strict
// lane, which ends the chain before the baseline.
func (m *Model) chain(l string) (chain []string, strict bool) {
	chain = []string{l}
	if m.pol.Lanes[l].Strict {
		return chain, true
	}
	for _, f := range m.pol.Lanes[l].Fallback {
		if slices.Contains(chain, f) {
			continue
		}
		chain = append(chain, f)
		if m.pol.Lanes[f].Strict {
			return chain, true
		}
	}
	return chain, false
}

// laneName is the lane-name rule on a value already trimmed of spaces and
// tabs: lower-cased, then 1 to 63 characters of a-z, 0-9 and '-', starting
// and ending with a letter or digit.
func laneName(s string) (string, bool) {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	if len(b) < 1 || len(b) > 63 || b[0] == '-' || b[len(b)-1] == '-' {
		return "", false
	}
	for _, c := range b {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return "", false
		}
	}
	return string(b), true
}

// bucket is a request key's canary bucket, 0 to 9,999: the 64-bit FNV-1a
// hash of the key, through SplitMix64's finalizer, modulo 10,000 (the stable
// hash docs/routing.md names, so that every process splits a key alike).
func bucket(key string) uint64 {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * 0x100000001b3
	}
	h += 0x9e3779b97f4a7c15
	h = (h ^ h>>30) * 0xbf58476d1ce4e5b9
	h = (h ^ h>>27) * 0x94d049bb133111eb
	return (h ^ h>>31) % 10000
}

// Bucket is a request key's canary bucket, 0 to 9,999, as the model splits
// keys: for a data path whose split is a weighted choice, which a test
// makes by the key so that it answers as the model does.
func Bucket(key string) uint64 { return bucket(key) }
