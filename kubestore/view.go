package kubestore

import (
	"encoding/json"
	"maps"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lanesdev/lanes/registry"
)

// view is what the Store's informers have seen, and the instances that
// follow from it: the objects (EndpointSlices, pods' and Services'
// metadata, lanes' Leases), indexes from each object to the services it
// decides, and per service the instances last published. Every change to an
// object recomputes the services it decides and publishes the difference to
// the watchers, under one lock, so that every watcher sees the same changes
// in the same order.
type view struct {
	mu       sync.Mutex
	now      func() time.Time
	slices   map[string]*slice            // ns/name
	bySvc    map[string]set               // lanes service -> slice keys
	byPod    map[string]set               // ns/pod -> slice keys that point at it
	byKube   map[string]set               // ns/Service name -> slice keys of that Service
	byLease  map[string]set               // ns/lease -> managed slice keys that name it
	pods     map[string]map[string]string // ns/pod -> labels
	services map[string]map[string]string // ns/Service name -> annotations
	leases   map[string]*lease            // ns/name
	insts    map[string]map[string]*shown
	rev      int64
	watchers map[*watcher]struct{}
	changed  chan struct{} // closed and replaced at every change
	closed   bool
	// leasesStale is set while the Lease informer cannot be trusted (its
	// list or watch failed): no Lease expires meanwhile.
	leasesStale bool
}

type set map[string]struct{}

func (s set) add(k string) set {
	if s == nil {
		s = set{}
	}
	s[k] = struct{}{}
	return s
}

// slice is an EndpointSlice as the view keeps it.
type slice struct {
	key     string
	ns      string
	service string // the lanes service it belongs to; "" when none
	kube    string // ns/kubernetes.io/service-name; "" for a managed slice
	obj     *discoveryv1.EndpointSlice
	rv      uint64
	// A managed slice: the instance, its holder and lease.
	managed *managedInst
	seen    time.Time // when the view first saw the slice (the orphan grace)
}

type managedInst struct {
	inst   registry.Instance
	holder string
	lease  string // ns/name
	ttl    time.Duration
}

// lease is a lanes Lease: when the view last saw it change, and for how
// long that keeps it.
type lease struct {
	rv       string
	holder   string
	duration time.Duration
	seen     time.Time
}

func (l *lease) expires() time.Time { return l.seen.Add(l.duration) }

// shown is an instance as published, with what made it.
type shown struct {
	inst    registry.Instance
	holder  string // the registration token of a managed slice
	sliceRV uint64
	managed bool
}

func newView(now func() time.Time) *view {
	return &view{now: now, slices: map[string]*slice{}, bySvc: map[string]set{}, byPod: map[string]set{},
		byKube: map[string]set{}, byLease: map[string]set{}, pods: map[string]map[string]string{},
		services: map[string]map[string]string{}, leases: map[string]*lease{}, insts: map[string]map[string]*shown{},
		watchers: map[*watcher]struct{}{}, changed: make(chan struct{})}
}

func key(ns, name string) string { return ns + "/" + name }

// parseRV reads a resourceVersion. The API server's storage (etcd) makes
// them integers that grow with every write; the view compares them only to
// tell whether it has seen a write of its own Store.
func parseRV(s string) uint64 {
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}

// setSlice records an EndpointSlice (nil obj: deleted) and republishes the
// services it decides.
func (v *view) setSlice(ns, name string, obj *discoveryv1.EndpointSlice) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k := key(ns, name)
	dirty := set{}
	if old := v.slices[k]; old != nil {
		v.unindex(old)
		dirty.add(old.service)
	}
	if obj != nil {
		s := &slice{key: k, ns: ns, obj: obj, rv: parseRV(obj.ResourceVersion), seen: v.now()}
		if old := v.slices[k]; old != nil {
			s.seen = old.seen
		}
		v.classify(s)
		v.slices[k] = s
		v.index(s)
		dirty.add(s.service)
	} else {
		delete(v.slices, k)
	}
	v.publish(dirty)
}

// classify sets the service of s, and its managed instance.
func (v *view) classify(s *slice) {
	if s.obj.Labels[labelManagedBy] == managedBy {
		m, err := decodeManaged(s.ns, s.obj)
		if err == nil {
			s.managed = m
			s.service = m.inst.Service
		}
		return
	}
	name := s.obj.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return
	}
	s.kube = key(s.ns, name)
	svc := name
	if mapped := v.services[s.kube][AnnotationService]; mapped != "" {
		svc = mapped
	}
	if registry.CheckService(svc) == nil {
		s.service = svc
	}
}

func (v *view) index(s *slice) {
	if s.service != "" {
		v.bySvc[s.service] = v.bySvc[s.service].add(s.key)
	}
	if s.kube != "" {
		v.byKube[s.kube] = v.byKube[s.kube].add(s.key)
	}
	if s.managed != nil {
		v.byLease[s.managed.lease] = v.byLease[s.managed.lease].add(s.key)
	}
	for _, ep := range s.obj.Endpoints {
		if p := podOf(s.ns, ep); p != "" {
			v.byPod[p] = v.byPod[p].add(s.key)
		}
	}
}

func (v *view) unindex(s *slice) {
	drop := func(m map[string]set, k string) {
		if m[k] != nil {
			delete(m[k], s.key)
			if len(m[k]) == 0 {
				delete(m, k)
			}
		}
	}
	drop(v.bySvc, s.service)
	drop(v.byKube, s.kube)
	if s.managed != nil {
		drop(v.byLease, s.managed.lease)
	}
	for _, ep := range s.obj.Endpoints {
		if p := podOf(s.ns, ep); p != "" {
			drop(v.byPod, p)
		}
	}
}

// podOf returns ns/name of the pod behind an endpoint, or "".
func podOf(ns string, ep discoveryv1.Endpoint) string {
	r := ep.TargetRef
	if r == nil || r.Kind != "Pod" || r.Name == "" {
		return ""
	}
	if r.Namespace != "" {
		ns = r.Namespace
	}
	return key(ns, r.Name)
}

// setPod records a pod's labels (nil meta: deleted).
func (v *view) setPod(ns, name string, meta *metav1.ObjectMeta) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k := key(ns, name)
	if meta == nil {
		delete(v.pods, k)
	} else {
		// Only what lanes reads is kept: the lanes.dev/ labels and the
		// version.
		labels := map[string]string{}
		for l, val := range meta.Labels {
			if strings.HasPrefix(l, LabelPrefix) || l == labelVersion {
				labels[l] = val
			}
		}
		if old, ok := v.pods[k]; ok && maps.Equal(old, labels) {
			return // a change of its status: nothing lanes reads
		}
		v.pods[k] = labels
	}
	dirty := set{}
	for sk := range v.byPod[k] {
		dirty.add(v.slices[sk].service)
	}
	v.publish(dirty)
}

// setService records a Service's annotations (nil meta: deleted); its
// slices are classified again, since it may map them to another service.
func (v *view) setService(ns, name string, meta *metav1.ObjectMeta) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k := key(ns, name)
	if meta == nil {
		delete(v.services, k)
	} else {
		a := map[string]string{}
		for _, n := range serviceAnnotations {
			if val, ok := meta.Annotations[n]; ok {
				a[n] = val
			}
		}
		if old, ok := v.services[k]; ok && maps.Equal(old, a) {
			return
		}
		v.services[k] = a
	}
	dirty := set{}
	for sk := range v.byKube[k] {
		s := v.slices[sk]
		dirty.add(s.service)
		v.unindex(s)
		v.classify(s)
		v.index(s)
		dirty.add(s.service)
	}
	v.publish(dirty)
}

// setLease records a lanes Lease (nil: deleted).
func (v *view) setLease(ns, name string, l *lease) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k := key(ns, name)
	if l == nil {
		delete(v.leases, k)
	} else {
		if old := v.leases[k]; old != nil && old.rv == l.rv {
			l.seen = old.seen // a relist, not a renewal
		}
		v.leases[k] = l
	}
	v.publish(v.leaseServices(k))
}

func (v *view) leaseServices(k string) set {
	dirty := set{}
	for sk := range v.byLease[k] {
		dirty.add(v.slices[sk].service)
	}
	return dirty
}

// staleLeases is called when the Lease informer fails (true) and when it
// lists or watches again (false): while it cannot be trusted no Lease
// expires, and once it is back every Lease counts from then, since the
// renewals made meanwhile were not seen.
func (v *view) staleLeases(stale bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.leasesStale == stale {
		return
	}
	v.leasesStale = stale
	if !stale {
		now := v.now()
		for _, l := range v.leases {
			l.seen = now
		}
	}
	v.signal()
}

// live reports whether a managed slice is held by a Lease that has not
// expired.
func (v *view) live(m *managedInst, now time.Time) bool {
	l := v.leases[m.lease]
	return l != nil && l.holder == m.holder && (v.leasesStale || now.Before(l.expires()))
}

// compute returns the instances of service as the objects say.
func (v *view) compute(service string, now time.Time) map[string]*shown {
	keys := make([]string, 0, len(v.bySvc[service]))
	for k := range v.bySvc[service] {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := map[string]*shown{}
	// A registration wins over a Service's endpoint of the same id or the
	// same address, as registry.Union decides: a pod that registers itself
	// in a lane (or that lanes up's mirror shows in the lane it registered
	// in) is that lane's, although its pod has no lane label and its
	// Service's endpoint would otherwise show it as the baseline's.
	var registered map[string]bool // addresses of live registrations
	for _, k := range keys {
		if s := v.slices[k]; s.managed != nil && v.live(s.managed, now) {
			if cur := out[s.managed.inst.ID]; cur == nil {
				out[s.managed.inst.ID] = &shown{inst: s.managed.inst, holder: s.managed.holder, sliceRV: s.rv, managed: true}
				if registered == nil {
					registered = map[string]bool{}
				}
				registered[s.managed.inst.Addr] = true
			}
		}
	}
	for _, k := range keys {
		s := v.slices[k]
		if s.managed != nil {
			continue
		}
		for _, ep := range s.obj.Endpoints {
			in, ok := v.endpoint(s, ep)
			if !ok || registered[in.Addr] {
				continue
			}
			if cur := out[in.ID]; cur != nil && (cur.managed || !cur.inst.Drain || in.Drain) {
				continue // the first ready one, in slice order, wins
			}
			out[in.ID] = &shown{inst: in, sliceRV: s.rv}
		}
	}
	return out
}

// endpoint makes the instance of one endpoint of a Service's slice, or
// false when the endpoint is no instance: not ready (and not draining), or
// its pod not seen yet or placing it in no valid lane.
func (v *view) endpoint(s *slice, ep discoveryv1.Endpoint) (registry.Instance, bool) {
	c := ep.Conditions
	ready := c.Ready == nil || *c.Ready
	serving := ready
	if c.Serving != nil {
		serving = *c.Serving
	}
	terminating := c.Terminating != nil && *c.Terminating
	var in registry.Instance
	switch {
	case terminating && serving:
		in.Drain = true // still answers what it has; takes nothing new
	case terminating || !ready:
		return in, false
	}
	if len(ep.Addresses) == 0 {
		return in, false
	}
	port, ok := v.port(s)
	if !ok {
		return in, false
	}
	in.Service = s.service
	in.Addr = net.JoinHostPort(ep.Addresses[0], strconv.Itoa(int(port)))
	if ep.Zone != nil {
		in.Zone = *ep.Zone
	}
	if ep.NodeName != nil {
		in.Host = *ep.NodeName
	}
	var labels map[string]string
	if p := podOf(s.ns, ep); p != "" {
		pl, seen := v.pods[p]
		if !seen {
			// Never guess the baseline for a pod whose labels are not
			// known yet: it may be a lane's.
			return in, false
		}
		labels = pl
		ns, name, _ := strings.Cut(p, "/")
		in.ID = name + "." + ns
	} else {
		labels = s.obj.Labels
		// An endpoint's address is an IP or a domain name: only an IPv6
		// address has a character that an id may not.
		in.ID = strings.ReplaceAll(ep.Addresses[0], ":", "-") + "-" + strconv.Itoa(int(port)) + "." + s.ns
	}
	in.Lane = labels[LabelLane]
	in.Version = labels[labelVersion]
	in.Labels = podLabels(labels)
	in, err := registry.Normalize(in)
	return in, err == nil
}

// port returns the port of a Service's slice that instances are reached
// on: the one the Service's lanes.dev/port annotation names, else the
// first.
func (v *view) port(s *slice) (int32, bool) {
	want := v.services[s.kube][AnnotationPort]
	for _, p := range s.obj.Ports {
		if p.Port == nil || *p.Port < 1 {
			continue
		}
		if want == "" || (p.Name != nil && *p.Name == want) {
			return *p.Port, true
		}
	}
	return 0, false
}

// podLabels returns the instance labels of a pod's labels: those under
// LabelPrefix, without it, but the lane; at most MaxLabels of them, the
// first by key.
func podLabels(labels map[string]string) map[string]string {
	var keys []string
	for k := range labels {
		if strings.HasPrefix(k, LabelPrefix) && k != LabelLane && len(k) > len(LabelPrefix) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	slices.Sort(keys)
	if len(keys) > MaxLabels {
		keys = keys[:MaxLabels]
	}
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		out[strings.TrimPrefix(k, LabelPrefix)] = labels[k]
	}
	return out
}

// publish recomputes the dirty services and hands every difference to the
// watchers. v.mu must be held.
func (v *view) publish(dirty set) {
	now := v.now()
	for svc := range dirty {
		if svc == "" {
			continue
		}
		next := v.compute(svc, now)
		cur := v.insts[svc]
		var evs []registry.Event
		ids := make([]string, 0, len(next)+len(cur))
		for id := range cur {
			if next[id] == nil {
				ids = append(ids, id)
			}
		}
		for id, n := range next {
			if c := cur[id]; c == nil || !c.inst.Equal(n.inst) {
				ids = append(ids, id)
			}
		}
		sort.Strings(ids)
		for _, id := range ids {
			v.rev++
			if n := next[id]; n != nil {
				evs = append(evs, registry.Event{Type: registry.EventPut, Instance: n.inst, Revision: v.rev})
			} else {
				evs = append(evs, registry.Event{Type: registry.EventDelete, Instance: registry.Instance{Service: svc, ID: id}, Revision: v.rev})
			}
		}
		if len(next) == 0 {
			delete(v.insts, svc)
		} else {
			v.insts[svc] = next
		}
		if len(evs) > 0 {
			for w := range v.watchers {
				if w.service == "" || w.service == svc {
					w.push(evs)
				}
			}
		}
	}
	v.signal()
}

// signal wakes whoever waits for a change. v.mu must be held.
func (v *view) signal() {
	close(v.changed)
	v.changed = make(chan struct{})
}

// expire republishes the services of managed slices whose Lease has
// expired by now, and returns when the next one expires (zero: none), the
// slices and Leases expired for longer than grace (for deletion).
func (v *view) expire(grace time.Duration) (next time.Time, slices []*slice, leases []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.now()
	dirty := set{}
	for _, s := range v.slices {
		if s.managed != nil && !v.live(s.managed, now) {
			if sh := v.insts[s.service][s.managed.inst.ID]; sh != nil && sh.holder == s.managed.holder {
				dirty.add(s.service)
			}
		}
	}
	v.publish(dirty)
	later := func(t time.Time) {
		if t.After(now) && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	if v.leasesStale {
		return next, nil, nil
	}
	for k, l := range v.leases {
		later(l.expires())
		later(l.expires().Add(grace))
		if now.After(l.expires().Add(grace)) {
			leases = append(leases, k)
		}
	}
	for _, s := range v.slices {
		if s.managed == nil {
			continue
		}
		if l := v.leases[s.managed.lease]; l == nil || l.holder != s.managed.holder {
			// No Lease holds it: an orphan once its TTL and the grace have
			// passed since the view saw it.
			t := s.seen.Add(s.managed.ttl + grace)
			later(t)
			if now.After(t) {
				slices = append(slices, s)
			}
		} else if now.After(l.expires().Add(grace)) {
			slices = append(slices, s)
		}
	}
	return next, slices, leases
}

// decodeManaged reads the registration that a managed slice holds.
func decodeManaged(ns string, obj *discoveryv1.EndpointSlice) (*managedInst, error) {
	raw := obj.Annotations[annotationInstance]
	if len(raw) > maxInstanceBytes {
		return nil, errTooLarge
	}
	var in registry.Instance
	if err := json.Unmarshal([]byte(raw), &in); err != nil {
		return nil, err
	}
	in, err := registry.Normalize(in)
	if err != nil {
		return nil, err
	}
	holder, leaseName := obj.Annotations[annotationHolder], obj.Annotations[annotationLease]
	if holder == "" || leaseName == "" {
		return nil, errNoLease
	}
	ttl, err := time.ParseDuration(obj.Annotations[annotationTTL])
	if err != nil || ttl <= 0 {
		ttl = registry.DefaultTTL
	}
	return &managedInst{inst: in, holder: holder, lease: key(ns, leaseName), ttl: ttl}, nil
}

// shownAt returns what the view publishes for service/id, or nil.
func (v *view) shownAt(service, id string) *shown {
	return v.insts[service][id]
}

// waitFor waits until cond, called under the view's lock, holds.
func (v *view) waitFor(done <-chan struct{}, cond func() bool) bool {
	for {
		v.mu.Lock()
		ok, ch, closed := cond(), v.changed, v.closed
		v.mu.Unlock()
		if ok {
			return true
		}
		if closed {
			return false
		}
		select {
		case <-ch:
		case <-done:
			return false
		}
	}
}
