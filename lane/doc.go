// Package lane carries a request's lane through a fleet.
//
// A lane is a named slice of the fleet: a developer's laptop, a feature
// environment, a canary. Instances register with a lane; a request that
// carries a lane is routed to instances of that lane where they exist. A
// request with no lane is a baseline request, and the baseline is the
// ordinary fleet. In this package the baseline is the empty string "".
//
// A lane name is 1 to [MaxLen] characters of a-z, 0-9 and '-', starting and
// ending with a letter or digit. [Parse] trims and lower-cases a raw value and
// checks it; [Valid] tells whether a name is already normalised.
//
// # Context
//
// Inside a process the lane lives in a [context.Context]: [WithLane] stores
// it, [FromContext] reads it. [Detach] gives background work a context that
// keeps the lane (and every other value, such as the trace) but not the
// caller's cancellation.
//
// The lane, the request key of a baseline request ([WithKey]) and the
// header values that carry them are one value in the context, a [Carried],
// encoded once when the context gets them: a transport reads it with
// [Carry], once per call, and writes its headers from it
// ([Propagator.InjectCarried]) without parsing or encoding them again.
//
// # Propagation
//
// Between processes the lane travels in request headers, read and written
// through a [Carrier]: [HTTPHeader] for HTTP, [Metadata] for gRPC metadata,
// [MessageHeader] for message-queue headers. A [Propagator] reads the lane
// on the way in and writes it on the way out, hop to hop:
//
//	// server side
//	ctx = p.ExtractContext(r.Context(), lane.HTTPHeader(r.Header))
//	// client side, for each outgoing call
//	p.Inject(ctx, lane.HTTPHeader(out.Header))
//
// The lane is written twice: in the [Header] "x-lane", and as the member
// "lane" of the W3C baggage header, so that it also crosses hops that only
// forward OpenTelemetry baggage. On the way in, the first present source
// decides: "x-lane", then the baggage member, then the extra header names in
// [Propagator.Aliases], which let a fleet move over from another system. A
// value that is not a valid lane name never selects a lane: the request is
// routed as a baseline request, and [Propagator.Extract] returns a
// [*NameError] so that the caller can count it (or, at the edge, refuse the
// request).
//
// A baseline request clears the lane: [Propagator.Inject] removes stale lane
// headers, so that a lane set upstream does not leak past a hop that decided
// to serve the request as baseline.
//
// # OpenTelemetry
//
// OpenTelemetry's baggage propagator writes the baggage of the context
// (go.opentelemetry.io/otel/baggage) as the whole baggage header, before or
// after lanes does. So the lane is kept there too: [WithLane] sets the
// context's OpenTelemetry baggage member "lane" to the lane (none for the
// baseline), and the transports call [SyncBaggage] for each outgoing call,
// so that whichever writes last, the next hop reads one lane.
// [Propagator.Extract] reads baggage as OpenTelemetry Go does.
package lane
