package collector

import (
	"sort"
	"time"
)

// Hop is one span of a trace as `lanes trace` shows it, with its children.
type Hop struct {
	SpanID    string        `json:"span_id"`
	ParentID  string        `json:"parent_id,omitempty"`
	Name      string        `json:"name"`
	Kind      Kind          `json:"kind"`
	Service   string        `json:"service"`
	Callee    string        `json:"callee,omitempty"`
	Instance  string        `json:"instance,omitempty"`
	Address   string        `json:"address,omitempty"`
	Requested string        `json:"lane_requested"`
	Served    string        `json:"lane_served"`
	Own       string        `json:"instance_lane,omitempty"` // the serving instance's lane, on server and consumer spans
	Reason    string        `json:"reason,omitempty"`
	Eligible  int64         `json:"eligible,omitempty"`
	Retries   int64         `json:"retries,omitempty"`
	Start     time.Time     `json:"start"`
	Duration  time.Duration `json:"duration"`
	Error     bool          `json:"error,omitempty"`
	Lanes     bool          `json:"lanes"` // written by lanes (false for a user's own span)
	Findings  []Finding     `json:"findings,omitempty"`
	Depth     int           `json:"depth"`
	Children  []*Hop        `json:"-"`
}

// BuildTree arranges spans into trees of hops, roots first by start time, children by start
// time; a span whose parent is not among spans is a root. findings are attached to their spans.
func BuildTree(spans []Span, findings []Finding) []*Hop {
	hops := make(map[string]*Hop, len(spans))
	for i := range spans {
		sp := &spans[i]
		h := &Hop{SpanID: sp.SpanID, ParentID: sp.ParentID, Name: sp.Name, Kind: sp.Kind, Service: sp.Service,
			Callee: sp.Callee, Instance: sp.InstanceID, Address: sp.InstanceAddr, Requested: sp.Requested,
			Served: sp.Served, Own: sp.InstanceLane, Reason: sp.FallbackReason, Eligible: sp.Eligible,
			Retries: sp.Retries, Start: sp.Start, Duration: sp.Duration(), Error: sp.Error, Lanes: sp.HasLane}
		if sp.Kind == KindServer || sp.Kind == KindConsumer {
			h.Served = sp.InstanceLane
		}
		hops[sp.SpanID] = h
	}
	for _, f := range findings {
		if h := hops[f.SpanID]; h != nil {
			h.Findings = append(h.Findings, f)
		}
	}
	var roots []*Hop
	for _, h := range hops {
		if p := hops[h.ParentID]; p != nil && h.ParentID != "" {
			p.Children = append(p.Children, h)
		} else {
			roots = append(roots, h)
		}
	}
	byStart := func(list []*Hop) {
		sort.Slice(list, func(i, j int) bool {
			if !list[i].Start.Equal(list[j].Start) {
				return list[i].Start.Before(list[j].Start)
			}
			return list[i].SpanID < list[j].SpanID
		})
	}
	var depth func(h *Hop, d int)
	depth = func(h *Hop, d int) {
		h.Depth = d
		byStart(h.Children)
		for _, c := range h.Children {
			depth(c, d+1)
		}
	}
	byStart(roots)
	for _, r := range roots {
		depth(r, 0)
	}
	return roots
}

// Flatten lists the hops of trees depth first, as `lanes trace -o json` prints them.
func Flatten(roots []*Hop) []*Hop {
	var out []*Hop
	var walk func(h *Hop)
	walk = func(h *Hop) {
		out = append(out, h)
		for _, c := range h.Children {
			walk(c)
		}
	}
	for _, r := range roots {
		walk(r)
	}
	return out
}
