package gateway

import (
	"strings"

	"github.com/lanesdev/lanes/internal/lib/cowmap"
	"github.com/lanesdev/lanes/lane"
)

// laneVals are the header values the gateway writes for one lane, built
// once and shared by every request of the lane, so that a lane request
// allocates no header values. They are only ever read: the server and the
// transport read header values, and a slice of capacity 1 cannot be appended
// to in place.
type laneVals struct {
	name    string   // the lane, a copy that outlives any request
	lane    []string // {"alice"}: x-lane, x-lane-served
	baggage []string // {"lane=alice"}: the baggage header when the request had none
}

// maxLaneVals bounds the cache: lane names come from clients, and a client
// cycling through names must not grow it for ever. Past the bound, values are
// built per request.
const maxLaneVals = 1024

// laneCache maps lanes to their values, at most maxLaneVals of them.
type laneCache struct {
	m cowmap.Map[string, *laneVals]
}

func newLaneVals(l string) *laneVals {
	l = strings.Clone(l) // l may be in a request's buffer
	return &laneVals{name: l, lane: []string{l}[:1:1], baggage: []string{lane.BaggageKey + "=" + l}[:1:1]}
}

// get returns the values of lane l, a valid lane name.
func (c *laneCache) get(l string) *laneVals {
	if v, ok := c.m.Load(l); ok {
		return v
	}
	// The key is the values' own copy of l, which may be in a request's
	// buffer.
	nv := newLaneVals(l)
	v, _ := c.m.LoadOrStore(nv.name, func() *laneVals { return nv }, maxLaneVals)
	return v
}
