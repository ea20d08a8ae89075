package collector

import (
	"encoding/hex"
	"strings"
	"time"
	"unicode/utf8"
	"unsafe"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/lanesdev/lanes/lanestrace"
)

// Kind is a span's kind, as OpenTelemetry names them.
type Kind uint8

const (
	KindUnspecified Kind = iota
	KindInternal
	KindServer
	KindClient
	KindProducer
	KindConsumer
)

var kindNames = [...]string{"unspecified", "internal", "server", "client", "producer", "consumer"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unspecified"
}

// MarshalText writes the kind's name.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// Span is what the store keeps of one span: its place in the trace, its service, and the lanes
// attributes (lanestrace) that the integrity checks and `lanes trace` read. Other attributes are
// not kept.
type Span struct {
	TraceID  string // 32 hex digits
	SpanID   string // 16 hex digits
	ParentID string // "" for a root span
	Name     string
	Kind     Kind
	Service  string // the resource's service.name
	Start    time.Time
	End      time.Time
	Error    bool   // status code ERROR
	Status   string // the status message, if any

	// Lanes attributes; HasLane is false on spans that lanes did not write (a user's own): a
	// span that lanes wrote has lane.requested, or lane.service (a routing decision, which leaves
	// out lane.requested for the baseline).
	HasLane        bool
	Requested      string
	Served         string
	FallbackReason string
	Callee         string // lane.service
	InstanceID     string
	InstanceAddr   string
	InstanceLane   string
	Eligible       int64
	Retries        int64
	Admitted       bool // lane.guard.admitted; true where absent
	Exempt         bool // lane.guard.exempt: admitted for its exempt path or method, not lane traffic
	ConsumerLane   string
	DeliveryCount  int64
	Entry          bool

	// sender is the scope of the credential that sent the span (see Sender.scope): the
	// trace_broken check matches a root span only with a lane request served under the same one.
	sender string
}

// Duration is End minus Start.
func (s *Span) Duration() time.Duration { return s.End.Sub(s.Start) }

// size is what the store charges for s: the struct and the bytes of its strings. It counts each
// string's bytes once even where two fields share them, so it errs on the high side.
func (s *Span) size() int64 {
	n := int64(unsafe.Sizeof(*s)) + spanOverhead
	for _, f := range []string{s.TraceID, s.SpanID, s.ParentID, s.Name, s.Service, s.Status, s.Requested, s.Served,
		s.FallbackReason, s.Callee, s.InstanceID, s.InstanceAddr, s.InstanceLane, s.ConsumerLane, s.sender} {
		n += int64(len(f))
	}
	return n
}

// spanOverhead is what the store's indexes cost per span (map entries, slice slots), charged
// with each span.
const spanOverhead = 256

// converter turns OTLP spans into Spans, cutting every string it keeps (names, the service, the
// status message, attribute values) to max bytes, and counting the values it cut.
type converter struct {
	max       int
	truncated int64
}

// str returns v, cut to c.max bytes on a rune boundary. A cut value is copied, so that it does
// not hold the request's larger buffer.
func (c *converter) str(v string) string {
	if len(v) <= c.max {
		return v
	}
	c.truncated++
	n := c.max
	for n > 0 && !utf8.RuneStart(v[n]) {
		n--
	}
	return strings.Clone(v[:n])
}

// fromOTLP converts the spans of one OTLP request.
func (c *converter) fromOTLP(rss []*tracepb.ResourceSpans) []*Span {
	var out []*Span
	for _, rs := range rss {
		service := "unknown_service"
		if r := rs.GetResource(); r != nil {
			if v, ok := stringAttr(r.GetAttributes(), "service.name"); ok && v != "" {
				service = c.str(v)
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, ps := range ss.GetSpans() {
				if s := c.convert(ps, service); s != nil {
					out = append(out, s)
				}
			}
		}
	}
	return out
}

func (c *converter) convert(ps *tracepb.Span, service string) *Span {
	if len(ps.GetTraceId()) != 16 || len(ps.GetSpanId()) != 8 {
		return nil // not a valid span: OTLP requires both ids
	}
	s := &Span{
		TraceID:  hex.EncodeToString(ps.GetTraceId()),
		SpanID:   hex.EncodeToString(ps.GetSpanId()),
		Name:     c.str(ps.GetName()),
		Kind:     kindOf(ps.GetKind()),
		Service:  service,
		Start:    time.Unix(0, int64(ps.GetStartTimeUnixNano())),
		End:      time.Unix(0, int64(ps.GetEndTimeUnixNano())),
		Admitted: true,
	}
	if p := ps.GetParentSpanId(); len(p) == 8 {
		s.ParentID = hex.EncodeToString(p)
	}
	if st := ps.GetStatus(); st != nil {
		s.Error = st.GetCode() == tracepb.Status_STATUS_CODE_ERROR
		s.Status = c.str(st.GetMessage())
	}
	for _, kv := range ps.GetAttributes() {
		v := kv.GetValue()
		switch attribute := kv.GetKey(); attribute {
		case string(lanestrace.Requested):
			s.HasLane, s.Requested = true, c.str(v.GetStringValue())
		case string(lanestrace.Served):
			s.Served = c.str(v.GetStringValue())
		case string(lanestrace.FallbackReason):
			s.FallbackReason = c.str(v.GetStringValue())
		case string(lanestrace.Service):
			s.HasLane, s.Callee = true, c.str(v.GetStringValue())
		case string(lanestrace.InstanceID):
			s.InstanceID = c.str(v.GetStringValue())
		case string(lanestrace.InstanceAddr):
			s.InstanceAddr = c.str(v.GetStringValue())
		case string(lanestrace.InstanceLane):
			s.InstanceLane = c.str(v.GetStringValue())
		case string(lanestrace.Eligible):
			s.Eligible = v.GetIntValue()
		case string(lanestrace.Retries):
			s.Retries = v.GetIntValue()
		case string(lanestrace.GuardAdmitted):
			s.Admitted = v.GetBoolValue()
		case string(lanestrace.GuardExempt):
			s.Exempt = v.GetBoolValue()
		case string(lanestrace.ConsumerLane):
			s.ConsumerLane = c.str(v.GetStringValue())
		case string(lanestrace.DeliveryCount):
			s.DeliveryCount = v.GetIntValue()
		case string(lanestrace.Entry):
			s.Entry = v.GetBoolValue()
		}
	}
	if s.Callee != "" && s.FallbackReason == "" {
		// A decision leaves out the reason of a request served by the lane it asked for
		// (lanestrace.Decision.Attributes).
		s.FallbackReason = lanestrace.ReasonNone
	}
	return s
}

func kindOf(k tracepb.Span_SpanKind) Kind {
	switch k {
	case tracepb.Span_SPAN_KIND_INTERNAL:
		return KindInternal
	case tracepb.Span_SPAN_KIND_SERVER:
		return KindServer
	case tracepb.Span_SPAN_KIND_CLIENT:
		return KindClient
	case tracepb.Span_SPAN_KIND_PRODUCER:
		return KindProducer
	case tracepb.Span_SPAN_KIND_CONSUMER:
		return KindConsumer
	}
	return KindUnspecified
}

func stringAttr(kvs []*commonpb.KeyValue, key string) (string, bool) {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue(), true
		}
	}
	return "", false
}
