// Package lanestrace holds what lanes writes into OpenTelemetry traces: the span attributes that
// record each hop's routing decision, and their values. The transports (laneshttp, lanesgrpc,
// lanesnats), the gateway, and the trace collector of `lanes up` (which checks lane integrity on
// the spans it receives) all use these names, so they are written once, here.
//
// Every client-side and gateway span carries the routing decision:
//
//	lane.requested        the lane the request carried, normalised ("" for a baseline request)
//	lane.served           the lane of the instance that served it ("" for the baseline)
//	lane.fallback_reason  why served differs from requested (FallbackReason values)
//	lane.service          the service called
//	lane.instance.id      the instance chosen
//	lane.instance.addr    its address
//	lane.eligible         how many instances were eligible
//	lane.retries          how many times the call was retried on another instance
//
// Server spans carry the instance's own lane (lane.instance.lane), the lane received
// (lane.requested) and whether the lane guard admitted the request (lane.guard.admitted), and
// lane.guard.exempt where it admitted it only because the path or method is exempt.
// Message spans carry the message's lane (lane.requested), the consumer's lane
// (lane.consumer.lane) and the delivery count (lane.delivery_count).
package lanestrace

import "go.opentelemetry.io/otel/attribute"

// Span attribute keys.
const (
	Requested      = attribute.Key("lane.requested")
	Served         = attribute.Key("lane.served")
	FallbackReason = attribute.Key("lane.fallback_reason")
	Service        = attribute.Key("lane.service")
	InstanceID     = attribute.Key("lane.instance.id")
	InstanceAddr   = attribute.Key("lane.instance.addr")
	Eligible       = attribute.Key("lane.eligible")
	Retries        = attribute.Key("lane.retries")
	InstanceLane   = attribute.Key("lane.instance.lane")
	// InstanceTunnel is where an instance reached through lanes dev's tunnel really runs: the
	// address of the developer's machine, as the control plane sees it.
	InstanceTunnel = attribute.Key("lane.instance.tunnel")
	GuardAdmitted  = attribute.Key("lane.guard.admitted")
	// GuardExempt marks a server span whose request the guard admitted only because its path or
	// method is exempt (a health probe, a metrics scrape): it is not lane traffic, and the
	// integrity checks do not judge it.
	GuardExempt   = attribute.Key("lane.guard.exempt")
	ConsumerLane  = attribute.Key("lane.consumer.lane")
	DeliveryCount = attribute.Key("lane.delivery_count")
	// Entry marks the span of the hop where a request entered lanes (the gateway, or the first
	// lanes-aware service): the only place where a new trace may start.
	Entry = attribute.Key("lane.entry")
)

// Values of lane.fallback_reason.
const (
	ReasonNone             = "none"                // served by the lane requested (or a baseline request by the baseline)
	ReasonNoInstanceInLane = "no_instance_in_lane" // the lane (and its chain) has no instance of the service
	ReasonUnknownLane      = "unknown_lane"        // the lane exists nowhere: no instance of any service the caller knows is in it, and the policy does not name it
	ReasonEjected          = "ejected"             // the lane's instances are registered but ejected by outlier detection
	ReasonStrict           = "strict"              // a strict lane with no instance: the request failed rather than fall back
	ReasonExpired          = "expired"             // the lane's lifetime ended: it routes as the baseline
	ReasonCanary           = "canary"              // a baseline request split off to a canary lane
	ReasonInvalidLane      = "invalid_lane"        // the lane carried was not a valid name: routed as a baseline request
	ReasonFailover         = "failover"            // a retry: every eligible instance of the lane failed this call, so it followed the lane chain
)
