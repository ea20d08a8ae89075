package gateway

import (
	"strings"

	"github.com/lanesdev/lanes/lane"
)

// laneVals returns the header values the gateway writes for lane l, a valid
// lane name: lane's own encoding of the lane (lane.Encode, the values a
// lane.Carried carries), made once and shared by every request of the lane
// and by every transport, so that a lane request allocates no header
// values. They are only ever read: the server and the transport read header
// values, and a slice of capacity 1 cannot be appended to in place. Past
// the bound of lane.Encode's cache (lane names come from clients), the
// values are made per request.
//
// Its Header[0] is the lane's name, a copy that outlives any request; its
// Header ({"alice"}) is the value of x-lane and x-lane-served, its Baggage
// ({"lane=alice"}) the baggage header of a request that had none.
func laneVals(l string) *lane.Encoded {
	if e := lane.Encode(l); e != nil {
		return e
	}
	// Not a valid lane name: the callers' rules admit none, but the
	// values are still written as given.
	l = strings.Clone(l) // l may be in a request's buffer
	return &lane.Encoded{Header: []string{l}[:1:1], Baggage: []string{lane.BaggageKey + "=" + l}[:1:1]}
}
