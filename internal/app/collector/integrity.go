package collector

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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

// checker runs the integrity checks on spans as they arrive and keeps the latest findings.
type checker struct {
	store   *Store
	fleet   Fleet
	counter *prometheus.CounterVec
	max     int
	now     func() time.Time

	mu       sync.Mutex
	findings []Finding // newest last, at most max
	seen     map[string]bool
	// serving holds, per service, the lane requests it served recently (server spans with a
	// lane), for trace_broken; roots holds the root client spans of non-entry services that
	// have not been matched yet, since the server span that encloses them ends, and so arrives,
	// after them.
	serving map[string][]*Span
	roots   map[string][]*Span
}

// maxRecent bounds the per-service lists of the trace_broken check.
const maxRecent = 512

func newChecker(store *Store, fleet Fleet, counter *prometheus.CounterVec, max int) *checker {
	return &checker{store: store, fleet: fleet, counter: counter, max: max, now: time.Now,
		seen: map[string]bool{}, serving: map[string][]*Span{}, roots: map[string][]*Span{}}
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
		if sp.InstanceLane == "" || !sp.Admitted {
			return
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
		// A failover (the lane's instances failed this call) is no needless fallback, but its
		// chain must reach the lane served like any other.
		needless := sp.FallbackReason != lanestrace.ReasonFailover
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
		if p := enclosingServing(c.serving[sp.Service], sp); p != nil {
			c.mu.Unlock()
			c.broken(sp, p)
			return
		}
		c.roots[sp.Service] = bounded(append(c.roots[sp.Service], sp))
	case (sp.Kind == KindServer || sp.Kind == KindConsumer) && sp.HasLane && sp.Requested != "":
		c.serving[sp.Service] = bounded(append(c.serving[sp.Service], sp))
		var matched []*Span
		rest := c.roots[sp.Service][:0]
		for _, r := range c.roots[sp.Service] {
			if within(r, sp) {
				matched = append(matched, r)
			} else {
				rest = append(rest, r)
			}
		}
		c.roots[sp.Service] = rest
		c.mu.Unlock()
		for _, r := range matched {
			c.broken(r, sp)
		}
		return
	}
	c.mu.Unlock()
}

func (c *checker) broken(root, parent *Span) {
	c.add(TraceBroken, root, fmt.Sprintf("%s started a new trace with %s while serving %s in lane %q: the call was made with context.Background() or context.TODO(), so it carried no lane",
		root.Service, root.Name, parent.Name, parent.Requested), parent)
}

// enclosingServing returns the latest-starting span of list whose time encloses root's start.
func enclosingServing(list []*Span, root *Span) *Span {
	var best *Span
	for _, s := range list {
		if within(root, s) && (best == nil || s.Start.After(best.Start)) {
			best = s
		}
	}
	return best
}

func within(inner, outer *Span) bool {
	return inner.TraceID != outer.TraceID && !inner.Start.Before(outer.Start) && !inner.Start.After(outer.End)
}

func bounded(list []*Span) []*Span {
	if len(list) > maxRecent {
		return append(list[:0], list[len(list)-maxRecent:]...)
	}
	return list
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
	if len(c.findings) > c.max {
		for _, old := range c.findings[:len(c.findings)-c.max] {
			delete(c.seen, old.Kind+"/"+old.TraceID+"/"+old.SpanID)
		}
		c.findings = append(c.findings[:0], c.findings[len(c.findings)-c.max:]...)
	}
	c.mu.Unlock()
	if c.counter != nil {
		c.counter.WithLabelValues(kind, sp.Service).Inc()
	}
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
