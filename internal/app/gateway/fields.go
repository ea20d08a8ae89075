package gateway

import (
	"net/http"
	"net/netip"

	"github.com/lanesdev/lanes/lane"
)

// The gateway's rules (lane assignment, trust, forwarding headers, lane
// headers, error answers) are written once, over the small interfaces of this
// file, and both HTTP/1.1 paths call them: the net/http path (ServeHTTP) with
// the std* adapters, the fasthttp path (fast.go) with the fast* adapters.

// inbound is what the lane and trust rules read of a client's request,
// whichever server parsed it. Its header reads follow lane.Carrier
// (case-insensitive keys); it is only read. Strings it returns may live only
// as long as the request: what outlives it is copied (see laneVals.name).
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

// stdIn is a net/http request as an inbound.
type stdIn http.Request

func (r *stdIn) Get(key string) string      { return lane.HTTPHeader(r.Header).Get(key) }
func (r *stdIn) Values(key string) []string { return lane.HTTPHeader(r.Header).Values(key) }
func (r *stdIn) Set(key, value string)      {}
func (r *stdIn) Del(key string)             {}
func (r *stdIn) hostHeader() string         { return r.Host }
func (r *stdIn) peer() netip.Addr {
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		return ap.Addr().Unmap().WithZone("")
	}
	if a, err := netip.ParseAddr(r.RemoteAddr); err == nil {
		return a.Unmap().WithZone("")
	}
	return netip.Addr{}
}

// stdFields is a net/http header map as fields.
type stdFields http.Header

func (h stdFields) Get(key string) string          { return lane.HTTPHeader(h).Get(key) }
func (h stdFields) Values(key string) []string     { return lane.HTTPHeader(h).Values(key) }
func (h stdFields) Set(key, value string)          { lane.HTTPHeader(h).Set(key, value) }
func (h stdFields) Del(key string)                 { lane.HTTPHeader(h).Del(key) }
func (h stdFields) setVals(key string, v []string) { h[key] = v }
func (h stdFields) setBytes(key string, v []byte)  { h[key] = []string{string(v)} }

// stdOut is a net/http ResponseWriter as a responder.
type stdOut struct{ w http.ResponseWriter }

func (o stdOut) header() fields         { return stdFields(o.w.Header()) }
func (o stdOut) writeHeader(status int) { o.w.WriteHeader(status) }
func (o stdOut) writeString(s string)   { o.w.Write([]byte(s)) }
