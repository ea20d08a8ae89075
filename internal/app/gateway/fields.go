package gateway

import (
	"net/netip"

	"github.com/lanesdev/lanes/lane"
)

// The gateway's rules (lane assignment, trust, forwarding headers, lane
// headers, error answers) are written once, in the core, over the small
// interfaces of this file; each stack adapts its server's requests and
// answers to them: the net/http stack (stack_std.go) with the std*
// adapters, the fasthttp stack (stack_fast.go) with the fast* adapters.

// inbound is what the lane and trust rules read of a client's request,
// whichever server parsed it. Its header reads follow lane.Carrier
// (case-insensitive keys); it is only read. Strings it returns may live only
// as long as the request: what outlives it is copied (see laneVals).
type inbound interface {
	lane.Carrier
	// hostHeader is the request's host (the Host header), as sent.
	hostHeader() string
	// peer is the address of the direct peer, unmapped and without a zone;
	// invalid if unknown.
	peer() netip.Addr
}

// fields are headers the gateway writes: the outbound request's, or the
// answer's. Reads follow lane.Carrier; setVals shares v, which is never
// modified (see laneVals).
type fields interface {
	lane.Carrier
	setVals(key string, v []string)
	setBytes(key string, v []byte)
}

// responder is an answer the gateway writes itself (fail).
type responder interface {
	header() fields
	writeHeader(status int)
	writeString(s string)
}
