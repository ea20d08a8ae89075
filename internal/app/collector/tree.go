package collector

import (
	"sort"

	"github.com/lanesdev/lanes/adminapi"
)

// node is a hop with its children, while a tree is built.
type node struct {
	hop      adminapi.Hop
	start    int64
	children []*node
}

// Hops arranges spans into trees and lists their hops depth first, as `lanes trace` prints them:
// roots by start time, children by start time; a span whose parent is not among spans is a root.
// findings are attached to their spans.
func Hops(spans []Span, findings []Finding) []adminapi.Hop {
	nodes := make(map[string]*node, len(spans))
	for i := range spans {
		sp := &spans[i]
		h := adminapi.Hop{SpanID: sp.SpanID, ParentID: sp.ParentID, Name: sp.Name, Kind: sp.Kind.String(), Service: sp.Service,
			Callee: sp.Callee, Instance: sp.InstanceID, Address: sp.InstanceAddr, Requested: sp.Requested,
			Served: sp.Served, Reason: sp.FallbackReason, Eligible: sp.Eligible, Retries: sp.Retries,
			Start: sp.Start, Duration: adminapi.Duration(sp.Duration()), Error: sp.Error, Lanes: sp.HasLane}
		if sp.Kind == KindServer || sp.Kind == KindConsumer {
			h.Served = sp.InstanceLane
		}
		nodes[sp.SpanID] = &node{hop: h, start: sp.Start.UnixNano()}
	}
	for _, f := range findings {
		if n := nodes[f.SpanID]; n != nil {
			n.hop.Findings = append(n.hop.Findings, f)
		}
	}
	var roots []*node
	for _, n := range nodes {
		if p := nodes[n.hop.ParentID]; p != nil && n.hop.ParentID != "" {
			p.children = append(p.children, n)
		} else {
			roots = append(roots, n)
		}
	}
	byStart := func(list []*node) {
		sort.Slice(list, func(i, j int) bool {
			if list[i].start != list[j].start {
				return list[i].start < list[j].start
			}
			return list[i].hop.SpanID < list[j].hop.SpanID
		})
	}
	out := make([]adminapi.Hop, 0, len(spans))
	var walk func(n *node, depth int)
	walk = func(n *node, depth int) {
		n.hop.Depth = depth
		out = append(out, n.hop)
		byStart(n.children)
		for _, c := range n.children {
			walk(c, depth+1)
		}
	}
	byStart(roots)
	for _, r := range roots {
		walk(r, 0)
	}
	return out
}
