package gateway

import (
	"strings"
	"sync"
	"sync/atomic"

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

// laneCache maps lanes to their values; copy on write.
type laneCache struct {
	m  atomic.Pointer[map[string]*laneVals]
	mu sync.Mutex
}

func newLaneVals(l string) *laneVals {
	l = strings.Clone(l) // l may be in a request's buffer
	return &laneVals{name: l, lane: []string{l}[:1:1], baggage: []string{lane.BaggageKey + "=" + l}[:1:1]}
}

// get returns the values of lane l, a valid lane name.
func (c *laneCache) get(l string) *laneVals {
	if m := c.m.Load(); m != nil {
		if v := (*m)[l]; v != nil {
			return v
		}
	}
	return c.add(l)
}

func (c *laneCache) add(l string) *laneVals {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	if old != nil {
		if v := (*old)[l]; v != nil {
			return v
		}
		if len(*old) >= maxLaneVals {
			return newLaneVals(l)
		}
	}
	var n int
	if old != nil {
		n = len(*old)
	}
	m := make(map[string]*laneVals, n+1)
	if old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	v := newLaneVals(l)
	m[v.name] = v
	c.m.Store(&m)
	return v
}
