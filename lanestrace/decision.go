package lanestrace

import (
	"net/http"
	"strconv"

	"errors"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/routing"
)

// Decision is the routing decision of one hop, as the client side records it on its span.
type Decision struct {
	Service   string // the service called
	Requested string // the lane the request carried ("" for the baseline)
	Served    string // the lane of the instance chosen
	Reason    string // a Reason* value
	Instance  string // the instance chosen
	Addr      string
	Eligible  int // instances of the serving lane that may take the request
	Retries   int // moves to another instance within the call
}

// DecisionOf describes the pick res of a call to service for a request in lane requested,
// after retries moves, and err, the pick's error when no instance was chosen. It reads the
// engine's snapshot of the service (routing.Service.LaneSize) to tell an ejected lane from an
// empty one.
func DecisionOf(e *routing.Engine, service, requested string, res routing.Result, err error, retries int) Decision {
	d := Decision{Service: service, Requested: requested, Served: res.Lane, Retries: retries, Reason: ReasonNone}
	if res.Instance != nil {
		d.Instance, d.Addr = res.Instance.ID, res.Instance.Addr
	}
	if err != nil {
		var re *routing.Error
		if errors.As(err, &re) && re.Code == routing.CodeLaneUnavailable {
			d.Reason = ReasonStrict
		} else {
			d.Reason = ReasonNoInstanceInLane
		}
		return d
	}
	if e != nil {
		d.Eligible, _ = e.Service(service).LaneSize(res.Lane)
	}
	switch res.Reason {
	case routing.ReasonCanary:
		d.Reason = ReasonCanary
	case routing.ReasonInvalidLane:
		d.Reason = ReasonInvalidLane
	case routing.ReasonFallback, routing.ReasonLaneEmpty:
		d.Reason = ReasonFor(e, service, requested, res.Lane)
	case routing.ReasonFailover:
		if res.Lane != requested {
			d.Reason = ReasonFailover
		}
	}
	return d
}

// ReasonFor says why a request of service in lane requested was served by lane served instead:
// ReasonNone when it was not; ReasonExpired when the requested lane's lifetime has ended;
// ReasonEjected when the lane has instances of the service, but none was ready (outlier
// detection ejected them); ReasonNoInstanceInLane otherwise. It reads the engine's snapshot
// (routing.Service.LaneSize) and allocates nothing.
func ReasonFor(e *routing.Engine, service, requested, served string) string {
	switch {
	case served == requested:
		return ReasonNone
	case e == nil:
		return ReasonNoInstanceInLane
	case e.Policy().Expired(requested, time.Now()):
		return ReasonExpired
	}
	if _, members := e.Service(service).LaneSize(requested); members > 0 {
		return ReasonEjected
	}
	return ReasonNoInstanceInLane
}

// Attributes returns d as span attributes.
func (d Decision) Attributes() []attribute.KeyValue {
	return []attribute.KeyValue{
		Service.String(d.Service),
		Requested.String(d.Requested),
		Served.String(d.Served),
		FallbackReason.String(d.Reason),
		InstanceID.String(d.Instance),
		InstanceAddr.String(d.Addr),
		Eligible.Int(d.Eligible),
		Retries.Int(d.Retries),
	}
}

// Record sets d on span, and marks the span failed when no instance was chosen.
func (d Decision) Record(span trace.Span) {
	span.SetAttributes(d.Attributes()...)
	if d.Instance == "" {
		span.SetStatus(codes.Error, "no instance of "+d.Service+" for lane "+laneOrBaseline(d.Requested)+": "+d.Reason)
	}
}

// RecordServer sets the server side of a hop on span: the lane the request carried, the lane of
// the instance serving it, and whether the lane guard admitted it.
func RecordServer(span trace.Span, requested, instanceLane string, admitted bool) {
	span.SetAttributes(Requested.String(requested), InstanceLane.String(instanceLane), GuardAdmitted.Bool(admitted))
}

func laneOrBaseline(l string) string {
	if l == "" {
		return "the baseline"
	}
	return l
}

// EndHTTP records on the client span of an HTTP call its routing decision d and its outcome (err,
// or the status of res), and ends the span. The gateway and laneshttp.Transport end their spans
// with it.
func EndHTTP(span trace.Span, d Decision, res *http.Response, err error) {
	status := 0
	if res != nil {
		status = res.StatusCode
	}
	EndStatus(span, d, status, err)
}

// EndStatus is EndHTTP for an answer known by its status code alone (0: no
// answer), as a client other than net/http's gives it.
func EndStatus(span trace.Span, d Decision, status int, err error) {
	d.Record(span)
	switch {
	case err != nil:
		span.SetStatus(codes.Error, err.Error())
	case status != 0:
		span.SetAttributes(semconv.HTTPResponseStatusCode(status))
		if status >= 500 {
			span.SetStatus(codes.Error, strconv.Itoa(status)+" "+http.StatusText(status))
		}
	}
	span.End()
}
