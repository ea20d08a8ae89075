// Package mqlane is the lane selection of message consumers, written once
// for every message-queue backend (lanesnats, laneskafka, lanesamqp): a
// consumer instance registers under "mq.<service>.<group>" and owns lane L
// when the routing engine, asked for a request in lane L, names it among the
// eligible instances; the baseline (and anything that is not a valid lane
// name) belongs to the non-drained instances whose effective lane is the
// baseline. It also writes the consumer and producer spans of messages, so
// that the trace collector's integrity checks see every backend alike.
package mqlane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/internal/lib/hopspan"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanestrace"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// Label keys that a consumer adds to the instance it registers.
const (
	LabelService = "lanes.mq/service"
	LabelGroup   = "lanes.mq/group"
	LabelTopic   = "lanes.mq/topic"
)

// RegistryService is the service a consumer of group of service registers
// under: "mq.<service>.<group>".
func RegistryService(service, group string) string { return "mq." + service + "." + group }

// Labels returns in's labels with the consumer's three added (a copy).
func Labels(in map[string]string, service, group, topic string) map[string]string {
	labels := make(map[string]string, len(in)+3)
	for k, v := range in {
		labels[k] = v
	}
	labels[LabelService], labels[LabelGroup], labels[LabelTopic] = service, group, topic
	return labels
}

// Norm normalises a lane as lane.Propagator.InjectLane does: an invalid
// name is the baseline.
func Norm(l string) string {
	if l == "" || lane.Valid(l) {
		return l
	}
	if n, err := lane.Parse(l); err == nil {
		return n
	}
	return ""
}

// VisibleTimeout bounds how long WaitVisible waits when ctx has no deadline.
const VisibleTimeout = 30 * time.Second

// ErrNotVisible: the engine does not see a consumer's registration.
var ErrNotVisible = errors.New("the engine does not see the consumer's registration: does it follow the registry (routing.WithRegistry)?")

// WaitVisible waits until svc lists the instance id: an engine that does
// not follow the registry would never give the consumer a lane.
func WaitVisible(ctx context.Context, svc *routing.Service, id string) error {
	t := time.NewTimer(VisibleTimeout)
	defer t.Stop()
	for {
		changed := svc.Changed()
		if Self(svc, id) != nil {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("waiting for the engine to see %s/%s: %w", svc.Name(), id, ctx.Err())
		case <-t.C:
			return fmt.Errorf("%w (%s/%s after %v)", ErrNotVisible, svc.Name(), id, VisibleTimeout)
		}
	}
}

// Self returns the instance id as svc sees it, or nil while it is not
// visible.
func Self(svc *routing.Service, id string) *registry.Instance {
	for _, in := range svc.Instances() {
		if in.ID == id {
			return &in
		}
	}
	return nil
}

// Candidates adds to known (lane names, "" for the baseline) the baseline
// and the lanes of the group's instances, registered and effective: the
// lanes a consumer of the group may have to serve.
func Candidates(e *routing.Engine, svc *routing.Service, known map[string]bool) map[string]bool {
	out := make(map[string]bool, len(known)+2)
	out[""] = true
	for l := range known {
		out[Norm(l)] = true
	}
	for _, in := range svc.Instances() {
		out[Norm(in.Lane)] = true
		out[Norm(e.LaneOf(in))] = true
	}
	return out
}

// Owns decides whether the instance id (me, as the engine sees it) serves
// the messages of lane l ("" the baseline): the routing engine's answer for
// a request in lane l, exactly as for a call. The baseline belongs to the
// non-drained instances whose effective lane is the baseline (not Resolve:
// a canary rule would split the baseline by chance). A strict lane without
// consumers has no owner: its messages wait.
func Owns(e *routing.Engine, svc *routing.Service, me *registry.Instance, l string) bool {
	if me == nil {
		return false
	}
	if l == "" {
		return !me.Drain && e.LaneOf(*me) == ""
	}
	d, err := svc.Resolve(routing.Request{Lane: l})
	if err != nil {
		return false
	}
	return slices.Contains(d.Eligible, me.ID)
}

// Want returns the lanes among Candidates(known) that the instance id owns.
func Want(e *routing.Engine, svc *routing.Service, id string, known map[string]bool) map[string]bool {
	me := Self(svc, id)
	want := map[string]bool{}
	if me == nil {
		return want
	}
	for l := range Candidates(e, svc, known) {
		if Owns(e, svc, me, l) {
			want[l] = true
		}
	}
	return want
}

// StartConsumerSpan starts the consumer span of a message of lane msgLane
// handled by the instance inst (its effective lane from e), in the trace
// that ctx carries: the message's lane, the consumer's, which serves it, why
// they differ, the delivery count. system is the messaging system ("nats",
// "kafka", "rabbitmq"), dest where the message came from.
func StartConsumerSpan(ctx context.Context, tr trace.Tracer, e *routing.Engine, inst registry.Instance, topic, system, dest, msgLane string, deliveries int64) (context.Context, trace.Span) {
	own := e.LaneOf(inst)
	ctx, span := tr.Start(ctx, "process "+topic, trace.WithSpanKind(trace.SpanKindConsumer))
	if span.IsRecording() {
		hopspan.RecordServer(span, msgLane, own, true, false)
		span.SetAttributes(lanestrace.ConsumerLane.String(own), lanestrace.Served.String(own),
			lanestrace.FallbackReason.String(hopspan.ReasonFor(e, inst.Service, msgLane, own)),
			lanestrace.DeliveryCount.Int64(deliveries), lanestrace.InstanceID.String(inst.ID),
			semconv.MessagingSystemKey.String(system), semconv.MessagingDestinationName(dest))
	}
	return ctx, span
}

// StartProducerSpan starts the producer span of a message published in
// lane l of topic, to dest.
func StartProducerSpan(ctx context.Context, tr trace.Tracer, topic, system, dest, l string) (context.Context, trace.Span) {
	return tr.Start(ctx, "publish "+topic, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(producerAttrs(topic, system, dest, l)...))
}

func producerAttrs(topic, system, dest, l string) []attribute.KeyValue {
	return []attribute.KeyValue{lanestrace.Requested.String(l), lanestrace.Served.String(l), lanestrace.Service.String(topic),
		lanestrace.FallbackReason.String(lanestrace.ReasonNone),
		semconv.MessagingSystemKey.String(system), semconv.MessagingDestinationName(dest)}
}

// Stamp returns the headers of a message published in lane l (normalised
// with Norm): a copy of h with the lane in the x-lane header and the lane
// member of the W3C baggage header, as prop writes them (prop's aliases and
// stale lane headers are removed from a baseline message). It returns nil
// for a baseline message without headers.
func Stamp(prop lane.Propagator, l string, h map[string][]string) map[string][]string {
	switch {
	case len(h) > 0:
		out := make(lane.MessageHeader, len(h)+2)
		for k, v := range h {
			out[k] = v
		}
		prop.InjectLane(l, out)
		return out
	case l != "":
		return map[string][]string{lane.Header: {l}, lane.BaggageHeader: {lane.BaggageKey + "=" + l}}
	}
	return nil
}

// traceContext writes and reads the W3C traceparent header of messages.
var traceContext propagation.TraceContext

// InjectTrace writes the span context of ctx into h (traceparent,
// tracestate), when it has one. h must not be nil.
func InjectTrace(ctx context.Context, h map[string][]string) {
	traceContext.Inject(ctx, textMap(h))
}

// ExtractTrace returns ctx with the remote span context of h's
// traceparent, if any.
func ExtractTrace(ctx context.Context, h map[string][]string) context.Context {
	return traceContext.Extract(ctx, textMap(h))
}

// ExtractTraceFrom is ExtractTrace for headers of another shape.
func ExtractTraceFrom(ctx context.Context, c propagation.TextMapCarrier) context.Context {
	return traceContext.Extract(ctx, c)
}

// textMap is message headers as a propagation.TextMapCarrier, keys matched
// without regard to case (lane.MessageHeader).
type textMap map[string][]string

func (m textMap) Get(key string) string { return lane.MessageHeader(m).Get(key) }
func (m textMap) Set(key, v string)     { lane.MessageHeader(m).Set(key, v) }
func (m textMap) Keys() []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A Member is a consumer instance registered in the registry, as the
// engine sees it: what a backend's consumer runs its lanes by.
type Member struct {
	Engine *routing.Engine
	Svc    *routing.Service
	Inst   registry.Instance // as registered
	Lease  registry.Lease
}

// Join registers inst (placed and labelled by the caller) with ttl and
// waits for the engine to see it.
func Join(ctx context.Context, reg registry.Registry, e *routing.Engine, inst registry.Instance, ttl time.Duration) (*Member, error) {
	lease, err := reg.Register(ctx, inst, ttl)
	if err != nil {
		return nil, fmt.Errorf("register %s/%s: %w", inst.Service, inst.ID, err)
	}
	m := &Member{Engine: e, Svc: e.Service(inst.Service), Inst: lease.Instance(), Lease: lease}
	if err := WaitVisible(ctx, m.Svc, m.Inst.ID); err != nil {
		lease.Close()
		return nil, err
	}
	return m, nil
}

// ErrLeaseLost: the member's registration was lost.
var ErrLeaseLost = errors.New("registration lost")

// Run decides the member's lanes until ctx is done (it returns nil) or the
// registration is lost (an error wrapping ErrLeaseLost): it calls reconcile
// with the lanes the member owns among the baseline, the known lanes and
// those of the group's instances, at start and whenever the instances or
// the policy change, and every interval after calling discover (which also
// catches time-driven changes, such as a lane's expiry). known is read in
// Run's goroutine only, between discover and reconcile; every lane an
// instance had is remembered in it, up to maxKnown lanes.
func (m *Member) Run(ctx context.Context, interval time.Duration, known map[string]bool, maxKnown int, discover func(context.Context), reconcile func(want map[string]bool)) error {
	disc := time.NewTimer(0)
	defer disc.Stop()
	for {
		changed, polChanged := m.Svc.Changed(), m.Engine.PolicyChanged()
		for l := range Candidates(m.Engine, m.Svc, nil) {
			if l != "" && !known[l] && len(known) < maxKnown {
				known[l] = true // the lane of a consumer that may go: its messages stay
			}
		}
		reconcile(Want(m.Engine, m.Svc, m.Inst.ID, known))
		for dirty := false; !dirty; {
			select {
			case <-ctx.Done():
				return nil
			case <-m.Lease.Done():
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("%w: %s/%s: %v", ErrLeaseLost, m.Inst.Service, m.Inst.ID, m.Lease.Err())
			case <-changed:
				dirty = true
			case <-disc.C:
				discover(ctx)
				disc.Reset(interval)
				dirty = true
			case <-polChanged:
				dirty = true
			}
		}
	}
}
