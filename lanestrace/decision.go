package lanestrace

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Decision is the routing decision of one hop, as the client side records it on its span. The
// transports of lanes fill it from their pick; a transport of one's own can fill and Record it.
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

func laneOrBaseline(l string) string {
	if l == "" {
		return "the baseline"
	}
	return l
}
