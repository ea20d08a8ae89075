// Package hopspan writes a hop's routing into its spans, once for every transport of lanes: the
// client span's lanestrace.Decision from the pick (DecisionOf, ReasonFor), its end with the
// outcome of the call (EndHTTP, EndStatus), and the server side of a hop (RecordServer).
package hopspan

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/internal/lib/cowmap"
	"github.com/lanesdev/lanes/lanestrace"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// DecisionOf describes the pick res of a call to svc (a service of e) for a request in lane
// requested, after retries moves, and err, the pick's error when no instance was chosen. It reads
// the snapshot of the service (routing.Service.LaneSize) to tell an ejected lane from an empty
// one.
func DecisionOf(e *routing.Engine, svc *routing.Service, requested string, res routing.Result, err error, retries int) lanestrace.Decision {
	d := lanestrace.Decision{Service: svc.Name(), Requested: requested, Served: res.Lane, Retries: retries, Reason: lanestrace.ReasonNone}
	if res.Instance != nil {
		d.Instance, d.Addr = res.Instance.ID, res.Instance.Addr
		if res.Instance.Labels[registry.LabelPath] == registry.PathTunnel {
			d.Tunnel = res.Instance.Labels[registry.LabelTunnelFrom]
		}
	}
	if err != nil {
		var re *routing.Error
		if errors.As(err, &re) && re.Code == routing.CodeLaneUnavailable {
			d.Reason = lanestrace.ReasonStrict
		} else {
			d.Reason = lanestrace.ReasonNoInstanceInLane
		}
		return d
	}
	d.Eligible, _ = svc.LaneSize(res.Lane)
	switch res.Reason {
	case routing.ReasonCanary:
		d.Reason = lanestrace.ReasonCanary
	case routing.ReasonInvalidLane:
		d.Reason = lanestrace.ReasonInvalidLane
	case routing.ReasonFallback, routing.ReasonLaneEmpty:
		d.Reason = reasonFor(e, svc, requested, res.Lane)
	case routing.ReasonFailover:
		if res.Lane != requested {
			d.Reason = lanestrace.ReasonFailover
		}
	}
	return d
}

// ReasonFor says why a request of service in lane requested was served by lane served instead
// (a lanestrace.Reason* value): ReasonNone when it was not; ReasonExpired when the requested
// lane's lifetime has ended; ReasonUnknownLane when the lane exists nowhere, for an engine that
// follows the lanes of the whole registry (routing.Engine.UnknownLane); ReasonEjected when the lane has instances of the service, but none
// was ready (outlier detection ejected them); ReasonNoInstanceInLane otherwise. It reads the
// engine's snapshot (routing.Service.LaneSize) and allocates nothing.
func ReasonFor(e *routing.Engine, service, requested, served string) string {
	var svc *routing.Service
	if e != nil && served != requested {
		svc = e.Service(service)
	}
	return reasonFor(e, svc, requested, served)
}

// reasonFor is ReasonFor with the service's handle (nil when e is).
func reasonFor(e *routing.Engine, svc *routing.Service, requested, served string) string {
	switch {
	case served == requested:
		return lanestrace.ReasonNone
	case e == nil:
		return lanestrace.ReasonNoInstanceInLane
	case e.Policy().Expired(requested, time.Now()):
		return lanestrace.ReasonExpired
	case requested != "" && e.UnknownLane(requested):
		return lanestrace.ReasonUnknownLane
	}
	if _, members := svc.LaneSize(requested); members > 0 {
		return lanestrace.ReasonEjected
	}
	return lanestrace.ReasonNoInstanceInLane
}

// RecordServer sets the server side of a hop on span: the lane the request carried, the lane of
// the instance serving it, whether the lane guard admitted it, and whether only because the path
// or method is exempt (exempt: then the request is not lane traffic). The attribute set of each
// combination is made once (see attrSets), so that recording it allocates nothing.
func RecordServer(span trace.Span, requested, instanceLane string, admitted, exempt bool) {
	k := serverKey{requested, instanceLane, admitted, exempt}
	span.SetAttributes(serverSets.get(k, k.attributes, func(k serverKey) serverKey {
		k.requested, k.instanceLane = strings.Clone(k.requested), strings.Clone(k.instanceLane)
		return k
	})...)
}

// serverKey is the server side of a hop, as RecordServer records it.
type serverKey struct {
	requested, instanceLane string
	admitted, exempt        bool
}

// attributes returns k as span attributes, leaving out those at the value a reader takes for an
// absent one (lane.instance.lane for the baseline, lane.guard.exempt when false).
func (k serverKey) attributes() []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, 4)
	kv = append(kv, lanestrace.Requested.String(k.requested))
	if k.instanceLane != "" {
		kv = append(kv, lanestrace.InstanceLane.String(k.instanceLane))
	}
	kv = append(kv, lanestrace.GuardAdmitted.Bool(k.admitted))
	if k.exempt {
		kv = append(kv, lanestrace.GuardExempt.Bool(true))
	}
	return kv
}

// RecordDecision sets the routing decision d on the client span of a call, as d.Record does,
// with d's attribute set made once (see attrSets): recording the decision of a call like one
// recorded before allocates nothing.
func RecordDecision(span trace.Span, d lanestrace.Decision) {
	if kv, ok := decisionSet(d); ok {
		span.SetAttributes(kv...)
		return
	}
	d.Record(span)
}

// RecordDecisionMidSpan is RecordDecision for a span that gets more attributes after the
// decision, as otelgrpc's client span does: it starts with two (rpc.method and rpc.system.name,
// in its default semantic conventions), and gets three after the pick (server.address and
// server.port when the call is sent, the status code at its end). The span SDK grows a span's
// attribute slice to exactly the length it needs when that more than doubles it, and doubles it
// otherwise; given at once, the decision grows the slice to exactly its own end, and the next
// attributes grow it again. Given in two parts (see firstPart), the first grows the slice to
// exactly its end and the second doubles it, to room for what comes after: on otelgrpc's client
// span, as many allocations and fewer bytes (see docs/performance.md). The span's attributes are
// the same.
func RecordDecisionMidSpan(span trace.Span, d lanestrace.Decision) {
	kv, ok := decisionSet(d)
	if !ok {
		d.Record(span)
		return
	}
	if n := firstPart(len(kv)); n < len(kv) {
		span.SetAttributes(kv[:n]...)
		kv = kv[n:]
	}
	span.SetAttributes(kv...)
}

// firstPart returns how many of a decision's n attributes RecordDecisionMidSpan gives first, on a
// span with two attributes that gets three after them: at least three, so that the first part
// more than doubles the slice (to 2+first exactly), and enough that the doubled slice holds all
// 2+n+3. For the decisions of a baseline call (four attributes) that is three and one; for a
// lane call served by its lane (five), three and two; for a fallback (six), four and two.
func firstPart(n int) int {
	return max(3, (n+2)/2)
}

// decisionSet returns the attribute set of d, made once (see attrSets), and false for a decision
// that RecordDecision records otherwise: no instance (the span fails, with its message), or a
// retry, which is rare.
func decisionSet(d lanestrace.Decision) ([]attribute.KeyValue, bool) {
	if d.Instance == "" || d.Retries != 0 {
		return nil, false
	}
	return decisionSets.get(d, d.Attributes, func(d lanestrace.Decision) lanestrace.Decision {
		d.Requested = strings.Clone(d.Requested) // read from a request; the rest is the engine's
		return d
	}), true
}

// attrSets caches attribute sets by what they describe: the decisions of the routes and lanes
// that a process calls, and the server sides of the hops it serves, are few, and each is made
// once. The attributes are shared: the span SDK copies what SetAttributes is given. Lane names
// and instances come from outside, so an attrSets holds at most maxSets entries; past that,
// a set is made for each call, as it was before there was a cache.
type attrSets[K comparable] struct {
	m cowmap.Map[K, []attribute.KeyValue]
}

// maxSets bounds each cache of attribute sets.
const maxSets = 1024

// get returns the set of k, made by make; own returns a copy of k that holds none of the request's
// memory, to keep.
func (c *attrSets[K]) get(k K, make func() []attribute.KeyValue, own func(K) K) []attribute.KeyValue {
	if kv, ok := c.m.Load(k); ok {
		return kv
	}
	if c.m.Len() >= maxSets {
		return make()
	}
	kv, _ := c.m.LoadOrStore(own(k), make, maxSets)
	return kv
}

var (
	serverSets   attrSets[serverKey]
	decisionSets attrSets[lanestrace.Decision]
)

// EndHTTP records on the client span of an HTTP call its routing decision d and its outcome (err,
// or the status of res), and ends the span. The gateway and laneshttp.Transport end their spans
// with it.
func EndHTTP(span trace.Span, d lanestrace.Decision, res *http.Response, err error) {
	status := 0
	if res != nil {
		status = res.StatusCode
	}
	EndStatus(span, d, status, err)
}

// EndStatus is EndHTTP for an answer known by its status code alone (0: no
// answer), as a client other than net/http's gives it.
func EndStatus(span trace.Span, d lanestrace.Decision, status int, err error) {
	RecordDecision(span, d)
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
