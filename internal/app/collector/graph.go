package collector

import (
	"sort"
	"time"

	"github.com/lanesdev/lanes/adminapi"
)

// Graph draws the service graph from the client spans that started within window before now: one
// edge per caller, callee and requested lane, with its calls, errors and fallbacks, and the lanes
// that served them.
func (c *Collector) Graph(window time.Duration) adminapi.Graph {
	now := c.store.now()
	from := now.Add(-window)
	type key struct{ from, to, lane string }
	edges := map[key]*adminapi.Edge{}
	services := map[string]bool{}
	c.store.each(func(sp *Span) {
		if sp.Start.Before(from) || !sp.HasLane || sp.Callee == "" || (sp.Kind != KindClient && sp.Kind != KindProducer) {
			return
		}
		k := key{sp.Service, sp.Callee, sp.Requested}
		e := edges[k]
		if e == nil {
			e = &adminapi.Edge{From: k.from, To: k.to, Lane: k.lane, Served: map[string]int{}}
			edges[k] = e
		}
		e.Calls++
		if sp.Error {
			e.Errors++
		}
		if sp.InstanceID != "" {
			e.Served[sp.Served]++
			if sp.Served != sp.Requested && sp.FallbackReason != "canary" {
				e.Fallbacks++
			}
		}
		services[sp.Service], services[sp.Callee] = true, true
	})
	g := adminapi.Graph{Window: adminapi.Duration(window), Services: []string{}, Edges: []adminapi.Edge{}}
	secs := window.Seconds()
	for _, e := range edges {
		if secs > 0 {
			e.Rate, e.ErrorRate = float64(e.Calls)/secs, float64(e.Errors)/secs
		}
		g.Edges = append(g.Edges, *e)
	}
	for s := range services {
		g.Services = append(g.Services, s)
	}
	sort.Strings(g.Services)
	sort.Slice(g.Edges, func(i, j int) bool {
		a, b := g.Edges[i], g.Edges[j]
		if a.From != b.From {
			return a.From < b.From
		}
		if a.To != b.To {
			return a.To < b.To
		}
		return a.Lane < b.Lane
	})
	return g
}
