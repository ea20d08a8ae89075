package collector

import (
	"container/list"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/lanestrace"
)

// The kinds of findings.
const (
	Breach           = adminapi.FindingBreach
	NeedlessFallback = adminapi.FindingNeedlessFallback
	LaneLost         = adminapi.FindingLaneLost
	TraceBroken      = adminapi.FindingTraceBroken
)

// Finding is one lane integrity problem.
type Finding = adminapi.Finding

// Fleet answers the integrity checks' questions about the registry and the policy, at the time
// they are asked.
type Fleet interface {
	// LiveInLane reports whether service has a live instance in lane that is eligible for
	// traffic (registered, not draining).
	LiveInLane(service, lane string) bool
	// Reaches reports whether a request in lane may be served by an instance of lane served: the
	// lane itself, a lane of its fallback chain, or the baseline ("") where the lane is not
	// strict.
	Reaches(lane, served string) bool
	// Entry reports whether service is an entry point, where new traces start legitimately.
	Entry(service string) bool
}

// checker runs the integrity checks on spans as they arrive and keeps the latest findings. Both
// what it remembers and the findings count their bytes against a bound and drop the oldest first.
type checker struct {
	store   *Store
	fleet   Fleet
	counter *boundedCounter
	max     int   // findings kept at most
	maxFB   int64 // bytes charged for the findings kept at most
	maxSB   int64 // bytes charged for the per-service state at most
	now     func() time.Time

	mu           sync.Mutex
	findings     []Finding // newest last, within max and maxFB
	findingBytes int64
	seen         map[string]bool
	// services holds, per service, the lane requests it served recently (server spans with a
	// lane), for trace_broken, and the root client spans of non-entry services that have not been
	// matched yet, since the server span that encloses them ends, and so arrives, after them.
	// order lists their entries, oldest first, across services.
	services   map[string]*serviceState
	order      *list.List // of *stateEntry
	stateBytes int64
	dropped    CheckDropped
}

// CheckDropped counts what the integrity checks let go to stay within their bounds.
type CheckDropped struct {
	Findings int64 // findings dropped, the oldest first
	State    int64 // remembered spans of the trace_broken check dropped, the oldest first
}

// serviceState is what the trace_broken check remembers of one service, oldest first.
type serviceState struct {
	serving, roots []*stateEntry
}

// stateEntry is one span the trace_broken check remembers: a pared copy, what it is charged, and
// its place in the checker's order.
type stateEntry struct {
	sp      *Span
	service string
	serving bool
	bytes   int64
	elem    *list.Element
}

// maxRecent bounds the per-service lists of the trace_broken check.
const maxRecent = 512

// What the checker charges beyond the strings: a service's map entry and state, and a remembered
// span's entry and list element; a finding's slice slot and its key in seen (with the key's
// bytes, counted with the finding).
const (
	serviceOverhead = 256
	entryOverhead   = 128
	findingOverhead = 128
)

func newChecker(store *Store, fleet Fleet, counter *boundedCounter, max int, maxBytes int64) *checker {
	return &checker{store: store, fleet: fleet, counter: counter, max: max, maxFB: maxBytes / 2, maxSB: maxBytes - maxBytes/2,
		now: time.Now, seen: map[string]bool{}, services: map[string]*serviceState{}, order: list.New()}
}

// check runs every check that spans (just stored) make possible.
func (c *checker) check(spans []*Span) {
	for _, sp := range spans {
		c.checkServed(sp)
		c.checkLineage(sp)
		c.checkBroken(sp)
	}
}

// checkServed finds breaches and needless fallbacks on one span.
func (c *checker) checkServed(sp *Span) {
	if !sp.HasLane || c.fleet == nil {
		return
	}
	switch sp.Kind {
	case KindServer, KindConsumer:
		if sp.InstanceLane == "" || !sp.Admitted || sp.Exempt {
			return // a refusal, or a probe of an exempt path: no lane traffic served
		}
		if sp.Requested == "" && sp.FallbackReason != lanestrace.ReasonCanary {
			c.add(Breach, sp, fmt.Sprintf("a baseline request was served by an instance of lane %q", sp.InstanceLane), nil)
		} else if sp.Requested != "" && sp.InstanceLane != sp.Requested && !c.fleet.Reaches(sp.Requested, sp.InstanceLane) {
			c.add(Breach, sp, fmt.Sprintf("a request in lane %q was served by an instance of lane %q, which its chain does not reach", sp.Requested, sp.InstanceLane), nil)
		}
	case KindClient, KindProducer:
		if sp.Served == sp.Requested || sp.Error && sp.InstanceID == "" {
			return
		}
		switch sp.FallbackReason {
		case lanestrace.ReasonCanary, lanestrace.ReasonExpired, lanestrace.ReasonStrict, lanestrace.ReasonInvalidLane:
			return
		}
		// A failover (the lane's instances failed this call) and a fallback past ejected
		// instances (one refused the connection, or outlier detection took it out) are the
		// routing working, no needless fallback; but their chain must reach the lane served
		// like any other.
		needless := sp.FallbackReason != lanestrace.ReasonFailover && sp.FallbackReason != lanestrace.ReasonEjected
		switch {
		case sp.Requested == "" && sp.Served != "":
			c.add(Breach, sp, fmt.Sprintf("a baseline request to %s was sent to lane %q", sp.Callee, sp.Served), nil)
		case sp.Served != "" && !c.fleet.Reaches(sp.Requested, sp.Served):
			c.add(Breach, sp, fmt.Sprintf("a request in lane %q to %s was sent to lane %q, which its chain does not reach", sp.Requested, sp.Callee, sp.Served), nil)
		case needless && sp.Requested != "" && sp.Callee != "" && c.fleet.LiveInLane(sp.Callee, sp.Requested):
			c.add(NeedlessFallback, sp, fmt.Sprintf("a request in lane %q to %s fell back to %s (%s) although %s has a live instance in %q", sp.Requested, sp.Callee, laneName(sp.Served), sp.FallbackReason, sp.Callee, sp.Requested), nil)
		}
	}
}

// checkLineage finds lane_lost between sp and its nearest lanes ancestor, and between sp and its
// lanes descendants that arrived before it.
func (c *checker) checkLineage(sp *Span) {
	c.store.view(sp.TraceID, func(t *traceEntry) {
		if t == nil {
			return
		}
		if sp.HasLane {
			if a := lanesAncestor(t, sp); a != nil {
				c.lineage(a, sp)
			}
		}
		// Descendants whose nearest lanes ancestor is sp.
		var walk func(id string)
		walk = func(id string) {
			for _, ch := range t.children[id] {
				if ch.HasLane {
					if sp.HasLane {
						c.lineage(sp, ch)
					}
					continue
				}
				walk(ch.SpanID)
			}
		}
		walk(sp.SpanID)
	})
}

// lanesAncestor returns the nearest ancestor of sp that lanes wrote, or nil when none is stored.
func lanesAncestor(t *traceEntry, sp *Span) *Span {
	for p := t.byID[sp.ParentID]; p != nil; p = t.byID[p.ParentID] {
		if p.HasLane {
			return p
		}
	}
	return nil
}

// lineage checks one pair: child's lane must be its ancestor's, unless the ancestor is a call
// that a canary split sent to the canary lane (the canary lane travels downstream).
func (c *checker) lineage(anc, child *Span) {
	if child.Requested == anc.Requested {
		return
	}
	if (anc.Kind == KindClient || anc.Kind == KindProducer) && anc.FallbackReason == lanestrace.ReasonCanary && child.Requested == anc.Served {
		return
	}
	c.add(LaneLost, child, fmt.Sprintf("%s carries lane %q but its parent %s (%s) carries %q: the lane was changed without a routing reason",
		child.Name, child.Requested, anc.Name, anc.Service, anc.Requested), nil)
}

// checkBroken finds trace_broken: a root client span of a service that is not an entry point,
// started while the service served a lane request.
func (c *checker) checkBroken(sp *Span) {
	if c.fleet == nil {
		return
	}
	c.mu.Lock()
	switch {
	case (sp.Kind == KindClient || sp.Kind == KindProducer) && sp.ParentID == "" && !sp.Entry && !c.fleet.Entry(sp.Service):
		var p *Span
		if st := c.services[sp.Service]; st != nil {
			p = enclosingServing(st.serving, sp)
		}
		if p != nil {
			c.mu.Unlock()
			c.broken(sp, p)
			return
		}
		c.remember(sp, false)
	case (sp.Kind == KindServer || sp.Kind == KindConsumer) && sp.HasLane && sp.Requested != "":
		c.remember(sp, true)
		var matched []*Span
		if st := c.services[sp.Service]; st != nil {
			rest := st.roots[:0]
			for _, r := range st.roots {
				if within(r.sp, sp) {
					matched = append(matched, r.sp)
					c.forgetLocked(r)
				} else {
					rest = append(rest, r)
				}
			}
			clear(st.roots[len(rest):])
			st.roots = rest
			c.forgetServiceIfEmpty(sp.Service, st)
		}
		c.mu.Unlock()
		for _, r := range matched {
			c.broken(r, sp)
		}
		return
	}
	c.mu.Unlock()
}

// remember keeps a pared copy of sp in its service's state (the lane requests served, or the
// unmatched roots), then drops the oldest entries while the state is over its bound.
func (c *checker) remember(sp *Span, serving bool) {
	st := c.services[sp.Service]
	if st == nil {
		st = &serviceState{}
		c.services[sp.Service] = st
		c.stateBytes += serviceOverhead + int64(len(sp.Service))
	}
	kept := &Span{TraceID: sp.TraceID, SpanID: sp.SpanID, Name: sp.Name, Kind: sp.Kind, Service: sp.Service,
		Start: sp.Start, End: sp.End, HasLane: sp.HasLane, Requested: sp.Requested, sender: sp.sender}
	e := &stateEntry{sp: kept, service: sp.Service, serving: serving, bytes: kept.size() + entryOverhead}
	e.elem = c.order.PushBack(e)
	c.stateBytes += e.bytes
	list := &st.roots
	if serving {
		list = &st.serving
	}
	*list = append(*list, e)
	for len(*list) > maxRecent {
		c.dropped.State++
		c.forgetLocked((*list)[0])
		*list = removeFirst(*list)
	}
	for c.stateBytes > c.maxSB && c.order.Len() > 0 {
		old := c.order.Front().Value.(*stateEntry)
		c.dropped.State++
		c.forgetLocked(old)
		ost := c.services[old.service]
		if old.serving {
			ost.serving = removeEntry(ost.serving, old)
		} else {
			ost.roots = removeEntry(ost.roots, old)
		}
		c.forgetServiceIfEmpty(old.service, ost)
	}
	c.forgetServiceIfEmpty(sp.Service, st)
}

// forgetServiceIfEmpty deletes the state of service when it remembers nothing.
func (c *checker) forgetServiceIfEmpty(service string, st *serviceState) {
	if len(st.serving) == 0 && len(st.roots) == 0 && c.services[service] == st {
		delete(c.services, service)
		c.stateBytes -= serviceOverhead + int64(len(service))
	}
}

// forgetLocked takes e out of the order and its bytes out of the state's charge; the caller takes
// it out of its service's list.
func (c *checker) forgetLocked(e *stateEntry) {
	c.order.Remove(e.elem)
	c.stateBytes -= e.bytes
}

func removeFirst(list []*stateEntry) []*stateEntry {
	copy(list, list[1:])
	list[len(list)-1] = nil
	return list[:len(list)-1]
}

// removeEntry removes e from list; entries are kept oldest first, so it is almost always the
// first.
func removeEntry(list []*stateEntry, e *stateEntry) []*stateEntry {
	for i, x := range list {
		if x == e {
			copy(list[i:], list[i+1:])
			list[len(list)-1] = nil
			return list[:len(list)-1]
		}
	}
	return list
}

func (c *checker) broken(root, parent *Span) {
	c.add(TraceBroken, root, fmt.Sprintf("%s started a new trace with %s while serving %s in lane %q: the call was made with context.Background() or context.TODO(), so it carried no lane",
		root.Service, root.Name, parent.Name, parent.Requested), parent)
}

// enclosingServing returns the latest-starting span of list whose time encloses root's start.
func enclosingServing(list []*stateEntry, root *Span) *Span {
	var best *Span
	for _, e := range list {
		if s := e.sp; within(root, s) && (best == nil || s.Start.After(best.Start)) {
			best = s
		}
	}
	return best
}

// within reports whether inner started while outer ran, in another trace, and both came from the
// same sender (one process sends both, so spans of different credentials are not matched).
func within(inner, outer *Span) bool {
	return inner.TraceID != outer.TraceID && inner.sender == outer.sender && !inner.Start.Before(outer.Start) && !inner.Start.After(outer.End)
}

func (c *checker) add(kind string, sp *Span, msg string, parent *Span) {
	key := kind + "/" + sp.TraceID + "/" + sp.SpanID
	f := Finding{Kind: kind, Service: sp.Service, TraceID: sp.TraceID, SpanID: sp.SpanID, Span: sp.Name, Message: msg, At: c.now()}
	if parent != nil {
		f.ParentTraceID, f.ParentSpanID = parent.TraceID, parent.SpanID
	}
	c.mu.Lock()
	if c.seen[key] {
		c.mu.Unlock()
		return
	}
	c.seen[key] = true
	c.findings = append(c.findings, f)
	c.findingBytes += findingSize(f)
	drop := 0
	for bytes := c.findingBytes; drop < len(c.findings)-1 && (len(c.findings)-drop > c.max || bytes > c.maxFB); drop++ {
		old := c.findings[drop]
		delete(c.seen, old.Kind+"/"+old.TraceID+"/"+old.SpanID)
		bytes -= findingSize(old)
		c.findingBytes = bytes
	}
	if drop > 0 {
		c.dropped.Findings += int64(drop)
		n := copy(c.findings, c.findings[drop:])
		clear(c.findings[n:])
		c.findings = c.findings[:n]
	}
	c.mu.Unlock()
	c.counter.inc(kind, sp.Service)
}

// findingSize is what the checker charges for f: the struct, its strings, and its key in seen.
func findingSize(f Finding) int64 {
	n := int64(unsafe.Sizeof(f)) + findingOverhead
	for _, s := range []string{f.Kind, f.Service, f.TraceID, f.SpanID, f.Span, f.Message, f.ParentTraceID, f.ParentSpanID} {
		n += int64(len(s))
	}
	return n + int64(len(f.Kind)+len(f.TraceID)+len(f.SpanID)+2)
}

// stats returns the size of what the checker keeps, and what it dropped.
func (c *checker) stats() (findings int, findingBytes, stateBytes int64, services int, dropped CheckDropped) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.findings), c.findingBytes, c.stateBytes, len(c.services), c.dropped
}

// list returns the findings newer than since (all, for the zero time), newest first, filtered by
// trace when traceID is not "".
func (c *checker) list(since time.Time, traceID string) []Finding {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Finding
	for i := len(c.findings) - 1; i >= 0; i-- {
		f := c.findings[i]
		if f.At.Before(since) {
			break
		}
		if traceID == "" || f.TraceID == traceID || f.ParentTraceID == traceID {
			out = append(out, f)
		}
	}
	return out
}

func laneName(l string) string {
	if l == "" {
		return "the baseline"
	}
	return "lane " + fmt.Sprintf("%q", l)
}
