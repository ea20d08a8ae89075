package routing

import (
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/policy"
	"github.com/lanesdev/lanes/registry"
)

// member is one eligible-or-not instance inside a snapshot.
type member struct {
	inst   *registry.Instance // as registered: in the service's instances, never modified
	lane   string             // effective lane, after dynamic tag rules
	weight int
	health *health
	state  uint32 // the health state when the snapshot was built
}

// group is the instances of one lane of one service (or of one zone, or one
// host, of that lane) that a request may reach.
type group struct {
	lane     string
	ready    []*member // eligible for ordinary picks
	halfOpen []*member // each would take the next request as its probe
	// waiting are the members ejected or probing when the snapshot was
	// built: a pick that finds a time-driven transition due checks them.
	waiting []*member
	panic   bool // baseline panic mode: ready holds ejected instances too
	// hosts holds a sub-group per host that has a ready or half-open
	// member; nil unless the policy turns on locality.host.
	hosts *subgroups
	zones *subgroups
	alias alias  // no columns (prob nil) when the ready weights are uniform
	mod   uint64 // 2^64 / len(ready), rounded up: the fastmod of pickReady

	_    [64]byte // next, written by every pick, on a cache line of its own
	next atomic.Uint64
	_    [56]byte
}

// narrow returns the sub-group of the caller's host when the group has one,
// else the sub-group of the caller's zone when it has one, or else the group
// itself (locality: same host, then same zone).
func (g *group) narrow(zone, host string) *group {
	if host != "" && g.hosts != nil {
		if h := g.hosts.get(host); h != nil {
			return h
		}
	}
	if zone != "" && g.zones != nil {
		if z := g.zones.get(zone); z != nil {
			return z
		}
	}
	return g
}

func (g *group) empty() bool { return g == nil || len(g.ready) == 0 && len(g.halfOpen) == 0 }

// pickReady chooses among g.ready by weight: a counter step, then either a
// round-robin index or an alias-table lookup. It is O(1) in the group size.
func (g *group) pickReady() *member {
	if g.alias.prob != nil {
		return g.ready[g.alias.pick(g.next.Add(1))]
	}
	return g.pickRoundRobin()
}

// pickRoundRobin is pickReady for uniform weights (no g.alias): the
// counter step, then i mod len(ready) by Lemire's fastmod on the counter's
// low 32 bits, two multiplications instead of a division. It inlines.
func (g *group) pickRoundRobin() *member {
	i := g.next.Add(1)
	hi, _ := bits.Mul64(g.mod*uint64(uint32(i)), uint64(len(g.ready)))
	return g.ready[hi]
}

// route is the precomputed answer for requests of one lane.
type route struct {
	group  *group // nil when err is set
	lane   string // the serving lane
	reason Reason
	err    *Error
	// split marks the route of a canary split: the request carries the
	// canary lane only while this route serves it.
	split bool
	// next is where the request goes when every instance of group is a
	// half-open one whose probe another request claimed: the rest of the
	// chain, as the next snapshot will say. Set only when group has no
	// ready instance.
	next *route
	// ready is group when a pick can take its answer from it and the
	// route alone: no error, no half-open instance to probe, no
	// time-driven transition due. nil sends the pick the long way
	// (Service.pickSlow).
	ready *group
	// requestLane is the lane that the requests Pick sends this way carry
	// downstream: the lane they came with, or the canary lane.
	requestLane string
	// local is set when group has zone or host sub-groups, which a
	// request from a zone or a host narrows the pick to.
	local bool
}

// errFor returns the route's error for a request of lane l. Routes are
// prebuilt per lane, so this allocates only for the one route that lanes
// nowhere in the snapshot or the policy share.
func (r *route) errFor(l string) error {
	if r.err.Lane == l {
		return r.err
	}
	return &Error{Code: r.err.Code, Service: r.err.Service, Lane: l}
}

// canarySplit sends the request-key buckets [from, to) to lane.
type canarySplit struct {
	from, to uint64
	lane     string
	route    *route
	// invalid is route for a request with an invalid lane: when the canary
	// lane cannot take it after all, it goes on as such a request, with
	// its reason.
	invalid *route
}

// snapshot is the immutable routing state of one service. It is rebuilt
// whenever the instances, the policy or an instance's health changes, and
// published through Service.snap.
type snapshot struct {
	service  string
	members  []member          // in id order, for member
	groups   []*group          // one per effective lane ("" is the baseline), for group
	byLane   map[string]*group // the groups by lane, when there are many; nil for a few
	routes   map[string]*route // lane requests, by request lane; nil when none
	lanes    laneTable         // routes, for the lookup of a pick
	unknown  route             // a lane request whose lane is nowhere in the snapshot or the policy
	baseline route             // a baseline request
	invalid  route             // a request with an invalid lane
	canaries []canarySplit
	due      int64 // when a time-driven change is due (ns): a health transition or a lane expiry; 0 for never
	outlier  policy.Outlier
	cp       *compiled // the policy the snapshot was built under, for the chains of PickWithout
}

// group returns the group of effective lane l, or nil.
func (s *snapshot) group(l string) *group {
	if s.byLane != nil {
		return s.byLane[l]
	}
	for _, g := range s.groups {
		if g.lane == l {
			return g
		}
	}
	return nil
}

// member returns the member of instance id, or nil.
func (s *snapshot) member(id string) *member {
	i, ok := slices.BinarySearchFunc(s.members, id, func(m member, id string) int { return strings.Compare(m.inst.ID, id) })
	if !ok {
		return nil
	}
	return &s.members[i]
}

// route finds the precomputed route of req, and the lane the request
// carries downstream. An invalid lane is counted in invalid and routed as a
// baseline request, canary splits included.
func (s *snapshot) route(req Request, invalid *atomic.Uint64) (*route, string) {
	l := req.Lane
	if l == "" {
		return s.split(req.Key, &s.baseline)
	}
	// The lanes of the routes are valid names: a lane found as it came
	// needs no check (the transports checked it at the edge).
	if r := s.lanes.get(l); r != nil {
		return r, l
	}
	n, ok := lane.Normalize(l)
	if !ok {
		invalid.Add(1)
		return s.split(req.Key, &s.invalid)
	}
	if r := s.lanes.get(n); r != nil {
		return r, n
	}
	return &s.unknown, n
}

// split applies the canary splits to a baseline request with key (random
// without one); base is the route of the requests that stay in the baseline.
func (s *snapshot) split(key string, base *route) (*route, string) {
	if len(s.canaries) == 0 {
		return base, ""
	}
	var b uint64
	if key != "" {
		b = keyBucket(key)
	} else {
		b = rand.Uint64N(buckets)
	}
	for i := range s.canaries {
		if c := &s.canaries[i]; b >= c.from && b < c.to {
			if base == &s.invalid {
				return c.invalid, c.lane
			}
			return c.route, c.lane
		}
	}
	return base, ""
}

// buckets is the resolution of canary splits: 0.01%.
const buckets = 10000

// build makes a snapshot of svc's instances under cp at time now. insts are
// in id order. It advances the health of every instance and so must run with
// the service's mutex held.
//
// A thousand engines that watch a small service each rebuild its snapshot
// at every change, so the build counts its allocations: the members in one,
// the lanes of a few found without a map, no route map or lane table
// without lanes, the alias columns of a group's sub-groups in one.
func build(svc string, insts []*registry.Instance, det *detector, cp *compiled, now int64, timed bool) *snapshot {
	s := &snapshot{
		service: svc,
		outlier: cp.outlier,
		cp:      cp,
	}
	pool := make([]member, 0, len(insts)) // one allocation for every member
	var laneBuf [8]string
	var countBuf [8]int
	lanes := keySlots{keys: laneBuf[:0]}
	perLane := countBuf[:0]
	det.begin()
	defer det.end()
	for _, in := range insts {
		w := in.EffectiveWeight()
		if w == 0 {
			det.keep(in.ID)
			continue
		}
		lane := cp.laneOf(in)
		if exp, ok := cp.expires[lane]; ok {
			if now >= exp {
				continue // an expired lane takes no traffic
			}
			if s.due == 0 || exp < s.due {
				s.due = exp
			}
		}
		h := det.of(in.ID)
		st, due := h.advance(now, cp.outlier)
		if due != 0 && (s.due == 0 || due < s.due) {
			s.due = due
		}
		pool = append(pool, member{inst: in, lane: lane, weight: w, health: h, state: st})
		var i int
		if lanes, i = lanes.slot(lane); i < len(perLane) {
			perLane[i]++
		} else {
			perLane = append(perLane, 1)
		}
	}
	s.members = pool
	// The members of each lane, in id order, in one allocation.
	var msBuf [8][]*member
	ms := msBuf[:0]
	all := make([]*member, len(pool))
	for _, n := range perLane {
		ms, all = append(ms, all[:0:n]), all[n:]
	}
	for i := range pool {
		m := &pool[i]
		_, l := lanes.slot(m.lane)
		ms[l] = append(ms[l], m)
	}
	byHost := cp.policy.Locality.Host
	baseMembers := []*member(nil)
	s.groups = make([]*group, len(lanes.keys))
	if len(lanes.keys) > len(laneBuf) {
		s.byLane = make(map[string]*group, len(lanes.keys))
	}
	for i, l := range lanes.keys {
		s.groups[i] = newGroup(l, ms[i], l == "", byHost, false)
		if s.byLane != nil {
			s.byLane[l] = s.groups[i]
		}
		if l == "" {
			baseMembers = ms[i]
		}
	}

	base := s.group("")
	if base.empty() {
		s.baseline = route{err: &Error{Code: CodeNoInstance, Service: svc}}
	} else {
		reason := ReasonBaseline
		if base.panic {
			reason = ReasonPanic
		}
		s.baseline = route{group: base, reason: reason}
		if len(base.ready) == 0 {
			// Only half-open instances: once their probes are claimed,
			// the baseline is in panic mode.
			s.baseline.next = &route{group: newGroup("", baseMembers, true, byHost, true), reason: ReasonPanic}
		}
	}
	// An invalid lane is routed as a baseline request; its reason says so,
	// unless the baseline is in panic mode, which says more (as for a lane
	// request that falls back to the baseline).
	s.invalid = s.baseline
	if s.invalid.reason == ReasonBaseline {
		s.invalid.reason = ReasonInvalidLane
	}

	// Every lane that has instances here or settings in the policy gets its
	// own route; any other lane goes straight to the baseline.
	addRoute := func(l string) {
		if _, ok := s.routes[l]; !ok {
			if s.routes == nil {
				s.routes = make(map[string]*route, len(lanes.keys)+len(cp.policy.Lanes))
			}
			r := s.chainRoute(l, nil)
			s.routes[l] = &r
		}
	}
	for _, l := range lanes.keys {
		if l != "" {
			addRoute(l)
		}
	}
	for l := range cp.policy.Lanes {
		addRoute(l)
	}
	s.unknown = s.fallbackToBaseline("", nil)

	var from uint64
	for _, c := range cp.canaries[svc] {
		to := from + uint64(c.Percent*buckets/100+0.5)
		g := s.group(c.Lane)
		if !g.empty() && to > from {
			r := &route{group: g, lane: c.Lane, reason: ReasonCanary, split: true, next: &s.baseline}
			inv := *r
			inv.next = &s.invalid
			s.canaries = append(s.canaries, canarySplit{from: from, to: to, lane: c.Lane, route: r, invalid: &inv})
		}
		from = to
	}
	s.fastPaths(timed)
	s.lanes = newLaneTable(s.routes)
	if afterBuild != nil {
		afterBuild(s)
	}
	return s
}

// afterBuild, when set, sees every snapshot build makes. It is nil outside
// the routing package's tests, which check each snapshot's invariants with
// it (invariants_test.go).
var afterBuild func(*snapshot)

// fastPaths marks the routes that Pick answers from alone (route.ready),
// and gives each the lane its requests carry downstream. A snapshot with a
// time-driven transition due has none unless timed: a timer rebuilds it
// when the transition is due (Service.armDue).
func (s *snapshot) fastPaths(timed bool) {
	mark := func(r *route, requestLane string) {
		r.requestLane = requestLane
		if g := r.group; r.err == nil && g != nil && len(g.ready) > 0 && len(g.halfOpen) == 0 && (s.due == 0 || timed) {
			r.ready = g
			r.local = g.hosts != nil || g.zones != nil
		}
	}
	for l, r := range s.routes {
		mark(r, l)
	}
	mark(&s.baseline, "")
	for _, c := range s.canaries {
		mark(c.route, c.lane)
		mark(c.invalid, c.lane)
	}
}

// chainRoute walks lane l's chain: l, its fallbacks, then the baseline unless
// the chain is strict. The instances of x count as absent (see absent); a
// snapshot's own routes are built with none.
func (s *snapshot) chainRoute(l string, x absent) route {
	chain, strict := s.cp.chain(l)
	return s.chainFrom(l, chain, strict, 0, x)
}

// chainFrom is the route of lane l from position from of its chain on.
func (s *snapshot) chainFrom(l string, chain []string, strict bool, from int, x absent) route {
	for i := from; i < len(chain); i++ {
		if g := s.group(chain[i]); !x.empty(g) {
			r := route{group: g, lane: chain[i], reason: ReasonLane}
			if i > 0 {
				r.reason = ReasonFallback
			}
			if !x.ready(g) {
				next := s.chainFrom(l, chain, strict, i+1, x)
				r.next = &next
			}
			return r
		}
	}
	if strict {
		return route{err: &Error{Code: CodeLaneUnavailable, Service: s.service, Lane: l}}
	}
	return s.fallbackToBaseline(l, x)
}

func (s *snapshot) fallbackToBaseline(l string, x absent) route {
	if s.baseline.err != nil || x.gone(&s.baseline) {
		return route{err: &Error{Code: CodeNoInstance, Service: s.service, Lane: l}}
	}
	r := s.baseline
	if r.reason == ReasonBaseline {
		r.reason = ReasonLaneEmpty
	}
	return r
}

// newGroup makes the group of lane l's members ms. byHost builds the host
// sub-groups (the policy's locality.host). claimed builds the group as it
// will be once the probes of its half-open members are claimed (they then
// count as probing).
func newGroup(l string, ms []*member, baseline, byHost, claimed bool) *group {
	g := &group{lane: l}
	probing := func(m *member) bool { return m.state == stateProbing || claimed && m.state == stateHalfOpen }
	healthy := true
	for _, m := range ms {
		if m.state != stateHealthy {
			healthy = false
			break
		}
	}
	if healthy {
		g.ready = ms // the usual case, without a copy: ms is the snapshot's too
	} else {
		g.ready = make([]*member, 0, len(ms))
	}
	for _, m := range ms {
		if healthy {
			break
		}
		switch {
		case m.state == stateHealthy:
			g.ready = append(g.ready, m)
		case m.state == stateHalfOpen && !claimed:
			g.halfOpen = append(g.halfOpen, m)
		default:
			g.waiting = append(g.waiting, m)
		}
	}
	if baseline && g.empty() && len(ms) > 0 {
		// Panic mode: never let ejection empty the baseline. An instance
		// whose probe is in flight stays out, unless nothing else is left.
		for _, m := range ms {
			if !probing(m) {
				g.ready = append(g.ready, m)
			}
		}
		if len(g.ready) == 0 {
			g.ready = ms
		}
		g.panic = true
	}
	// The alias columns of the group and of its sub-groups, whose ready
	// members are some of the group's, in one allocation.
	zones := spread(ms, zoneOf)
	var cols []uint32
	if !g.uniform() {
		tables := 1
		if zones {
			tables++
		}
		if byHost {
			tables++
		}
		cols = make([]uint32, 2*len(g.ready)*tables)
	}
	cols = g.finish(cols)
	if zones {
		g.zones, cols = g.split(zoneOf, cols)
	}
	if byHost {
		// Every host gets its sub-group, even when all members share one:
		// the host's sub-group has no zone preference, as the host rule
		// comes before the zone rule.
		if hosts, _ := g.split(hostOf, cols); len(hosts.entries) > 0 {
			g.hosts = hosts
		}
	}
	return g
}

func zoneOf(m *member) string { return m.inst.Zone }
func hostOf(m *member) string { return m.inst.Host }

// split makes the sub-groups of g by the key of each member (its zone or its
// host), in two passes over the members and a few allocations whatever the
// number of keys. A key whose members are all ejected or probing gets no
// sub-group: such instances do not count as being there. The sub-groups'
// alias columns are taken from cols (made when too short); split returns
// the rest.
func (g *group) split(key func(*member) string, cols []uint32) (*subgroups, []uint32) {
	type count struct{ ready, halfOpen int }
	var keyBuf [8]string
	var countBuf [8]count
	keys, counts := keySlots{keys: keyBuf[:0]}, countBuf[:0]
	slot := func(k string) int {
		var i int
		if keys, i = keys.slot(k); i == len(counts) {
			counts = append(counts, count{})
		}
		return i
	}
	nr, nh := 0, 0
	for _, m := range g.ready {
		if k := key(m); k != "" {
			counts[slot(k)].ready++
			nr++
		}
	}
	for _, m := range g.halfOpen {
		if k := key(m); k != "" {
			counts[slot(k)].halfOpen++
			nh++
		}
	}
	entries := make([]subgroup, len(keys.keys)) // the sub-groups too
	ready, halfOpen := make([]*member, 0, nr), make([]*member, 0, nh)
	subs := &subgroups{entries: entries}
	if len(entries) > len(keyBuf) {
		subs.byKey = make(map[string]*subgroup, len(entries))
	}
	for i, k := range keys.keys {
		entries[i].key = k
		sg := &entries[i].g
		sg.lane, sg.panic = g.lane, g.panic
		sg.ready, ready = ready[len(ready):len(ready):len(ready)+counts[i].ready], ready[:len(ready)+counts[i].ready]
		sg.halfOpen, halfOpen = halfOpen[len(halfOpen):len(halfOpen):len(halfOpen)+counts[i].halfOpen], halfOpen[:len(halfOpen)+counts[i].halfOpen]
		if subs.byKey != nil {
			subs.byKey[k] = &entries[i]
		}
	}
	for _, m := range g.ready {
		if k := key(m); k != "" {
			_, i := keys.slot(k)
			sg := &entries[i].g
			sg.ready = append(sg.ready, m)
		}
	}
	for _, m := range g.halfOpen {
		if k := key(m); k != "" {
			_, i := keys.slot(k)
			sg := &entries[i].g
			sg.halfOpen = append(sg.halfOpen, m)
		}
	}
	if len(cols) < 2*nr {
		cols = nil // too short for every sub-group: made when one needs them
	}
	for i := range entries {
		sg := &entries[i].g
		if cols == nil && !sg.uniform() {
			cols = make([]uint32, 2*nr)
		}
		cols = sg.finish(cols)
	}
	return subs, cols
}

// keySlots numbers the distinct keys it is given (zones, hosts, lanes), in
// the order it first sees them: a few are found by comparing them, more
// through a map, made once there are more than the buffer that keys starts
// on holds. It is a value, updated by slot's result, so that a buffer on
// its maker's stack stays there.
type keySlots struct {
	keys  []string
	index map[string]int
}

// slot returns k with key added when it is new, and the number of key.
func (k keySlots) slot(key string) (keySlots, int) {
	if k.index == nil {
		for i, o := range k.keys {
			if o == key {
				return k, i
			}
		}
		if len(k.keys) < cap(k.keys) {
			k.keys = append(k.keys, key)
			return k, len(k.keys) - 1
		}
		k.index = make(map[string]int, 2*len(k.keys))
		for i, o := range k.keys {
			k.index[o] = i
		}
	}
	if i, ok := k.index[key]; ok {
		return k, i
	}
	k.index[key] = len(k.keys)
	k.keys = append(k.keys, key)
	return k, len(k.keys) - 1
}

// subgroups are the sub-groups of a group by host or by zone. A process
// calls from one host and one zone, so the sub-group found last is kept, to
// be found again by comparing the key instead of hashing it; and so is the
// key looked up last that has no sub-group (a caller on a host without an
// instance of the service asks for it on every pick).
type subgroups struct {
	entries []subgroup
	byKey   map[string]*subgroup // nil for a few entries, which are compared
	last    atomic.Pointer[subgroup]
	miss    atomic.Pointer[string]
}

type subgroup struct {
	key string
	g   group
}

// lastOf returns the sub-group found last when its key is key, or nil. It
// inlines, and s may be nil.
func (s *subgroups) lastOf(key string) *group {
	if s == nil || key == "" {
		return nil
	}
	if e := s.last.Load(); e != nil && e.key == key {
		return &e.g
	}
	return nil
}

// get returns the sub-group of key, or nil.
func (s *subgroups) get(key string) *group {
	if e := s.last.Load(); e != nil && e.key == key {
		return &e.g
	}
	if m := s.miss.Load(); m != nil && *m == key {
		return nil
	}
	var e *subgroup
	if s.byKey != nil {
		e = s.byKey[key]
	} else {
		for i := range s.entries {
			if s.entries[i].key == key {
				e = &s.entries[i]
				break
			}
		}
	}
	if e == nil {
		miss := key // allocated here only, when the key missed is a new one
		s.miss.Store(&miss)
		return nil
	}
	s.last.Store(e)
	return &e.g
}

// spread reports whether the members of ms differ by key: two keys, or one
// key and members without one, in whatever order they come.
func spread(ms []*member, key func(*member) string) bool {
	first, keyless := "", false
	for _, m := range ms {
		switch k := key(m); {
		case k == "":
			keyless = true
		case first == "":
			first = k
		case k != first:
			return true
		}
		if keyless && first != "" {
			return true
		}
	}
	return false
}

// uniform reports whether the ready members all have the same weight.
func (g *group) uniform() bool {
	for _, m := range g.ready {
		if m.weight != g.ready[0].weight {
			return false
		}
	}
	return true
}

// finish computes the alias table, the fastmod constant and a random
// starting point, so that callers do not all begin with the same instance.
// The start is below 2^31, so that the counter's low 32 bits wrap only after
// two billion picks. The alias columns are taken from the start of cols
// (made here when too short); finish returns the rest.
func (g *group) finish(cols []uint32) []uint32 {
	if n := uint64(len(g.ready)); n > 0 {
		g.mod = ^uint64(0)/n + 1
	}
	if !g.uniform() {
		var buf [16]int // on the stack for a small group
		ws := buf[:0]
		if len(g.ready) > len(buf) {
			ws = make([]int, 0, len(g.ready))
		}
		for _, m := range g.ready {
			ws = append(ws, m.weight)
		}
		n := 2 * len(ws)
		if len(cols) < n {
			cols = make([]uint32, n)
		}
		g.alias = makeAlias(ws, cols[:n:n])
		cols = cols[n:]
	}
	g.next.Store(rand.Uint64N(1 << 31))
	return cols
}

// ids returns the ids of the ready members, for Decision.Eligible.
func (g *group) ids() []string {
	ids := make([]string, len(g.ready))
	for i, m := range g.ready {
		ids[i] = m.inst.ID
	}
	return ids
}
