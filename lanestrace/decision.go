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
	// Tunnel is where the instance chosen really runs when it is reached through lanes dev's
	// tunnel (its registry.LabelTunnelFrom label), "" otherwise.
	Tunnel string
}

// Attributes returns d as span attributes. Those at the value that a reader of the span takes
// for an absent attribute are left out: lane.requested and lane.served for the baseline (""),
// lane.fallback_reason for a request served by the lane it asked for (ReasonNone), lane.retries
// for a call that did not move (0), lane.eligible for none (0). lane.service is always there: it
// marks the decision of a hop that lanes routed. So the most common decision, a baseline call
// served by the baseline, is four attributes: the service, the instance's id and address, and
// how many were eligible.
func (d Decision) Attributes() []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, 8)
	kv = append(kv, Service.String(d.Service))
	if d.Requested != "" {
		kv = append(kv, Requested.String(d.Requested))
	}
	if d.Served != "" {
		kv = append(kv, Served.String(d.Served))
	}
	if d.Reason != ReasonNone {
		kv = append(kv, FallbackReason.String(d.Reason))
	}
	kv = append(kv, InstanceID.String(d.Instance), InstanceAddr.String(d.Addr))
	if d.Eligible != 0 {
		kv = append(kv, Eligible.Int(d.Eligible))
	}
	if d.Retries != 0 {
		kv = append(kv, Retries.Int(d.Retries))
	}
	if d.Tunnel != "" {
		kv = append(kv, InstanceTunnel.String(d.Tunnel))
	}
	return kv
}

// Record sets d on span (its Attributes), and marks the span failed when no instance was
// chosen.
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
