package adminapi

import (
	"strings"
	"time"
)

// ValidTraceID reports whether id is a W3C trace id as the admin API takes it: 32 lower-case hex
// digits, not all zero.
func ValidTraceID(id string) bool {
	if len(id) != 32 || id == strings.Repeat("0", 32) {
		return false
	}
	for _, c := range id {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Kinds of lane integrity findings (Finding.Kind).
const (
	// FindingBreach: a baseline request served by a lane instance, or a request served by a lane
	// that its chain does not reach.
	FindingBreach = "breach"
	// FindingNeedlessFallback: a hop fell back although its lane had a live, eligible instance of
	// the service (by the registry when the span arrived).
	FindingNeedlessFallback = "needless_fallback"
	// FindingLaneLost: a span whose lane differs from its parent's without a routing reason.
	FindingLaneLost = "lane_lost"
	// FindingTraceBroken: a service that is not an entry point started a new trace with a client
	// call while it was serving a lane request: the work was started with context.Background()
	// or context.TODO().
	FindingTraceBroken = "trace_broken"
)

// Finding is one lane integrity problem, found by the trace collector on spans as they arrived.
type Finding struct {
	Kind    string `json:"kind"`
	Service string `json:"service"`
	TraceID string `json:"trace_id"`
	SpanID  string `json:"span_id"`
	Span    string `json:"span"` // the span's name
	// ParentTraceID and ParentSpanID are, for trace_broken, the span the work most likely
	// belonged to: the service's lane request in progress when the new trace started.
	ParentTraceID string    `json:"parent_trace_id,omitempty"`
	ParentSpanID  string    `json:"parent_span_id,omitempty"`
	Message       string    `json:"message"`
	At            time.Time `json:"at"`
}

// TraceSummary describes one stored trace (GET /v1/traces).
type TraceSummary struct {
	TraceID  string    `json:"trace_id"`
	Root     string    `json:"root"`     // the root span's name (or the earliest span's)
	Service  string    `json:"service"`  // its service
	Lanes    []string  `json:"lanes"`    // lanes requested anywhere in the trace ("" for the baseline)
	Services []string  `json:"services"` // services with a span in it
	Spans    int       `json:"spans"`
	Errors   int       `json:"errors"`
	Findings int       `json:"findings"`
	Start    time.Time `json:"start"`
	Duration Duration  `json:"duration"`
}

// TraceStats describe the trace store and the integrity checks: their size, their bounds and what
// they let go to stay within them.
type TraceStats struct {
	Traces   int      `json:"traces"`
	Spans    int      `json:"spans"`
	Bytes    int64    `json:"bytes"`
	MaxSpans int      `json:"max_spans"`
	MaxBytes int64    `json:"max_bytes"`
	MaxAge   Duration `json:"max_age"`
	// MaxValueBytes is the length, in bytes, that span names and attribute values are cut to as
	// they arrive; Truncated counts the values cut.
	MaxValueBytes int   `json:"max_value_bytes"`
	Truncated     int64 `json:"truncated"`
	// Refused counts the spans refused because their sender's token may not send them.
	Refused int64      `json:"refused"`
	Checks  CheckStats `json:"checks"`
	Dropped struct {
		Traces int64 `json:"traces"`
		Spans  int64 `json:"spans"`
		// Findings and CheckState count the findings, and the spans the trace_broken check
		// remembered, dropped (the oldest first) to stay within Checks.MaxBytes.
		Findings   int64 `json:"findings"`
		CheckState int64 `json:"check_state"`
	} `json:"dropped"`
}

// CheckStats describe what the integrity checks keep: the findings, and the per-service state of
// the trace_broken check, each charged in bytes within half of MaxBytes.
type CheckStats struct {
	Findings     int   `json:"findings"`
	FindingBytes int64 `json:"finding_bytes"`
	StateBytes   int64 `json:"state_bytes"`
	Services     int   `json:"services"`
	MaxBytes     int64 `json:"max_bytes"`
}

// TraceList answers GET /v1/traces: the newest traces first.
type TraceList struct {
	Traces []TraceSummary `json:"traces"`
	Stats  TraceStats     `json:"stats"`
}

// Hop is one span of a trace, as `lanes trace` shows it (GET /v1/traces/{id}). Hops are listed
// depth first; Depth is the span's depth in its tree.
type Hop struct {
	SpanID    string `json:"span_id"`
	ParentID  string `json:"parent_id,omitempty"`
	Depth     int    `json:"depth"`
	Name      string `json:"name"`
	Kind      string `json:"kind"` // server, client, producer, consumer, internal
	Service   string `json:"service"`
	Callee    string `json:"callee,omitempty"` // the service called, on client and producer spans
	Instance  string `json:"instance,omitempty"`
	Address   string `json:"address,omitempty"`
	Requested string `json:"lane_requested"`
	// Served is the lane that served the hop: the lane chosen, on client spans; the instance's
	// own lane, on server and consumer spans.
	Served   string    `json:"lane_served"`
	Reason   string    `json:"reason,omitempty"` // lane.fallback_reason, on client spans
	Eligible int64     `json:"eligible,omitempty"`
	Retries  int64     `json:"retries,omitempty"`
	Start    time.Time `json:"start"`
	Duration Duration  `json:"duration"`
	Error    bool      `json:"error,omitempty"`
	Lanes    bool      `json:"lanes"` // written by lanes; false for a service's own span
	Findings []Finding `json:"findings,omitempty"`
}

// Trace answers GET /v1/traces/{id}.
type Trace struct {
	TraceID  string    `json:"trace_id"`
	Hops     []Hop     `json:"hops"`
	Findings []Finding `json:"findings"` // every finding on the trace, newest first
}

// FindingList answers GET /v1/findings: the newest first.
type FindingList struct {
	Findings []Finding `json:"findings"`
}

// Edge is one edge of the service graph drawn from collected traces: calls from one service to
// another in one requested lane, over the window of the graph.
type Edge struct {
	From      string `json:"from"`
	To        string `json:"to"`
	Lane      string `json:"lane"` // the lane requested ("" for the baseline)
	Calls     int    `json:"calls"`
	Errors    int    `json:"errors"`
	Fallbacks int    `json:"fallbacks"` // calls served by another lane than the one requested
	// Served counts the calls by the lane that served them ("" for the baseline): the calls of a
	// lane's edge that ran on its own instances, and those that ran on the baseline.
	Served map[string]int `json:"served"`
	// Rate and ErrorRate are per second over the window.
	Rate      float64 `json:"rate"`
	ErrorRate float64 `json:"error_rate"`
}

// Graph answers GET /v1/graph: who called whom over the last Window, edge by edge and lane by lane.
type Graph struct {
	Window   Duration `json:"window"`
	Services []string `json:"services"`
	Edges    []Edge   `json:"edges"`
}
