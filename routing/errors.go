package routing

import "fmt"

// Code is a routing failure of the contract.
type Code string

const (
	// CodeNoInstance: no instance may serve the request. For a baseline
	// request, the service has no baseline instance.
	CodeNoInstance Code = "no_instance"
	// CodeLaneUnavailable: a strict lane chain has no instance of the service.
	CodeLaneUnavailable Code = "lane_unavailable"
)

// Error is a routing failure. Transports map it to their own idiom: HTTP 503
// or gRPC Unavailable, with Code in the body or message.
//
// Pick returns errors prebuilt in the snapshot, so failing picks do not
// allocate either; do not modify a returned *Error.
type Error struct {
	Code    Code
	Service string
	Lane    string // the request lane; "" for a baseline request
}

func (e *Error) Error() string {
	switch {
	case e.Code == CodeLaneUnavailable:
		return fmt.Sprintf("%s: service %q has no instance in the strict chain of lane %q", e.Code, e.Service, e.Lane)
	case e.Lane == "":
		return fmt.Sprintf("%s: service %q has no baseline instance", e.Code, e.Service)
	default:
		return fmt.Sprintf("%s: service %q has no instance for lane %q or its fallbacks", e.Code, e.Service, e.Lane)
	}
}

// Is makes errors.Is(err, &Error{Code: c}) match any *Error with code c.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && (t.Service == "" || t.Service == e.Service)
}

// Reason says why a request was served where it was.
type Reason uint8

const (
	_ Reason = iota
	// ReasonLane: a lane request served by its own lane.
	ReasonLane
	// ReasonFallback: a lane request served by a lane of its fallback list.
	ReasonFallback
	// ReasonLaneEmpty: a lane request served by the baseline because no lane
	// of its chain has an instance of the service.
	ReasonLaneEmpty
	// ReasonBaseline: a baseline request served by the baseline.
	ReasonBaseline
	// ReasonInvalidLane: the request carried an invalid lane and was routed
	// as a baseline request.
	ReasonInvalidLane
	// ReasonCanary: a baseline request split off to a canary lane.
	ReasonCanary
	// ReasonProbe: the request is the half-open probe of an ejected instance.
	ReasonProbe
	// ReasonPanic: every baseline instance is ejected, so all of them are
	// eligible again.
	ReasonPanic
	// ReasonFailover: the retry of a lane request (Service.PickWithout)
	// served further along the lane chain, by a fallback lane or the
	// baseline, because every eligible instance of the lane that would
	// have served it failed this call.
	ReasonFailover
)

var reasonNames = [...]string{
	ReasonLane:        "lane",
	ReasonFallback:    "fallback",
	ReasonLaneEmpty:   "lane-empty",
	ReasonBaseline:    "baseline",
	ReasonInvalidLane: "invalid-lane",
	ReasonCanary:      "canary",
	ReasonProbe:       "probe",
	ReasonPanic:       "panic",
	ReasonFailover:    "failover",
}

func (r Reason) String() string {
	if int(r) < len(reasonNames) && reasonNames[r] != "" {
		return reasonNames[r]
	}
	return "unknown"
}

// MarshalText writes the reason's name.
func (r Reason) MarshalText() ([]byte, error) { return []byte(r.String()), nil }
