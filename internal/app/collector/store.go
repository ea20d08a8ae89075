package collector

import (
	"container/list"
	"sort"
	"sync"
	"time"

	"github.com/lanesdev/lanes/adminapi"
)

// Limits bound the collector's memory. The store keeps or drops a trace whole: when a limit is
// passed, the oldest traces (by their first span's arrival) go first. The integrity checks keep
// their findings and their per-service state within MaxCheckBytes, the oldest going first too.
// Zero fields take DefaultLimits' values.
type Limits struct {
	MaxSpans int           // spans kept at most
	MaxBytes int64         // bytes charged for the spans kept (see Span.size) at most
	MaxAge   time.Duration // a trace is dropped this long after its last span arrived
	// MaxValueBytes cuts every string kept of a span (its name, service, status message and
	// lanes attribute values) to this many bytes as it arrives.
	MaxValueBytes int
	// MaxCheckBytes bounds the integrity checks: half for the findings kept, half for what the
	// trace_broken check remembers per service (the lane requests each served recently and the
	// root spans not yet matched, and the services themselves).
	MaxCheckBytes int64
}

// DefaultLimits are the collector's limits in `lanes up`.
var DefaultLimits = Limits{MaxSpans: 100_000, MaxBytes: 64 << 20, MaxAge: time.Hour, MaxValueBytes: 1024, MaxCheckBytes: 16 << 20}

// withDefaults returns l with its zero fields set from DefaultLimits.
func (l Limits) withDefaults() Limits {
	if l.MaxSpans <= 0 {
		l.MaxSpans = DefaultLimits.MaxSpans
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultLimits.MaxBytes
	}
	if l.MaxAge <= 0 {
		l.MaxAge = DefaultLimits.MaxAge
	}
	if l.MaxValueBytes <= 0 {
		l.MaxValueBytes = DefaultLimits.MaxValueBytes
	}
	if l.MaxCheckBytes <= 0 {
		l.MaxCheckBytes = DefaultLimits.MaxCheckBytes
	}
	return l
}

// Dropped counts what the store let go to stay within its limits.
type Dropped struct {
	Traces  int64 `json:"traces"`
	Spans   int64 `json:"spans"`
	BySpans int64 `json:"by_spans"` // traces dropped for the span limit
	ByBytes int64 `json:"by_bytes"` // ... for the byte limit
	ByAge   int64 `json:"by_age"`   // ... for the age limit
}

// Stats describe the store.
type Stats struct {
	Traces  int     `json:"traces"`
	Spans   int     `json:"spans"`
	Bytes   int64   `json:"bytes"`
	Limits  Limits  `json:"-"`
	Dropped Dropped `json:"dropped"`
}

// traceEntry is one trace in the store.
type traceEntry struct {
	id       string
	spans    []*Span
	byID     map[string]*Span
	children map[string][]*Span // parent span id → its children
	bytes    int64
	first    time.Time // arrival of the first span
	last     time.Time // arrival of the last span
	elem     *list.Element
}

// traceOverhead is what the store charges for a trace beyond its spans: the entry, its maps and
// its place in the order list (measured by TestStoreMemoryBound, rounded up).
const traceOverhead = 1024

// Store keeps recent spans in memory, grouped by trace, within Limits. It is safe for concurrent
// use.
type Store struct {
	limits Limits
	now    func() time.Time

	mu      sync.Mutex
	traces  map[string]*traceEntry
	order   *list.List // of *traceEntry, oldest first
	spans   int
	bytes   int64
	dropped Dropped
}

// NewStore returns an empty store. Zero fields of limits take DefaultLimits' values.
func NewStore(limits Limits) *Store {
	limits = limits.withDefaults()
	return &Store{limits: limits, now: time.Now, traces: map[string]*traceEntry{}, order: list.New()}
}

// add stores spans, then evicts what the limits require, and returns the spans that were new (a
// span already stored is not stored again).
func (s *Store) add(spans []*Span) []*Span {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	fresh := spans[:0:0]
	for _, sp := range spans {
		t := s.traces[sp.TraceID]
		if t == nil {
			t = &traceEntry{id: sp.TraceID, byID: map[string]*Span{}, children: map[string][]*Span{}, first: now, bytes: traceOverhead}
			t.elem = s.order.PushBack(t)
			s.traces[sp.TraceID] = t
			s.bytes += traceOverhead
		}
		if _, dup := t.byID[sp.SpanID]; dup {
			continue
		}
		t.spans = append(t.spans, sp)
		t.byID[sp.SpanID] = sp
		if sp.ParentID != "" {
			t.children[sp.ParentID] = append(t.children[sp.ParentID], sp)
		}
		t.last = now
		n := sp.size()
		t.bytes += n
		s.bytes += n
		s.spans++
		fresh = append(fresh, sp)
	}
	s.evictLocked(now)
	return fresh
}

// evictLocked drops the oldest traces while a limit is passed, and traces past their age.
func (s *Store) evictLocked(now time.Time) {
	for e := s.order.Front(); e != nil; {
		t := e.Value.(*traceEntry)
		next := e.Next()
		switch {
		case s.spans > s.limits.MaxSpans:
			s.dropped.BySpans++
		case s.bytes > s.limits.MaxBytes:
			s.dropped.ByBytes++
		case now.Sub(t.last) > s.limits.MaxAge:
			s.dropped.ByAge++
		default:
			// Within every limit: traces are ordered by first arrival, so a later one may still
			// be past its age; look on only while that is possible.
			if now.Sub(t.first) <= s.limits.MaxAge {
				return
			}
			e = next
			continue
		}
		s.dropLocked(t)
		e = next
	}
}

func (s *Store) dropLocked(t *traceEntry) {
	s.order.Remove(t.elem)
	delete(s.traces, t.id)
	s.spans -= len(t.spans)
	s.bytes -= t.bytes
	s.dropped.Traces++
	s.dropped.Spans += int64(len(t.spans))
}

// Trace returns a copy of the spans of trace id, ordered by start time, or nil.
func (s *Store) Trace(id string) []Span {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evictLocked(s.now())
	t := s.traces[id]
	if t == nil {
		return nil
	}
	out := make([]Span, len(t.spans))
	for i, sp := range t.spans {
		out[i] = *sp
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// TraceSummary describes one stored trace.
type TraceSummary = adminapi.TraceSummary

// Filter selects traces. Zero fields select everything.
type Filter struct {
	Lane    string // a lane requested somewhere in the trace; "-" selects baseline-only traces
	Service string // a service with a span in the trace
	Limit   int    // newest first, at most this many; 0 is 20
}

// Recent returns the newest traces that match f, newest first.
func (s *Store) Recent(f Filter) []TraceSummary {
	if f.Limit <= 0 {
		f.Limit = 20
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evictLocked(s.now())
	var out []TraceSummary
	for e := s.order.Back(); e != nil && len(out) < f.Limit; e = e.Prev() {
		sum := summarize(e.Value.(*traceEntry))
		if f.matches(sum) {
			out = append(out, sum)
		}
	}
	return out
}

func (f Filter) matches(sum TraceSummary) bool {
	if f.Service != "" && !contains(sum.Services, f.Service) {
		return false
	}
	switch f.Lane {
	case "":
		return true
	case "-":
		return len(sum.Lanes) == 0 || (len(sum.Lanes) == 1 && sum.Lanes[0] == "")
	default:
		return contains(sum.Lanes, f.Lane)
	}
}

func summarize(t *traceEntry) TraceSummary {
	sum := TraceSummary{TraceID: t.id, Spans: len(t.spans)}
	var root *Span
	var end time.Time
	for _, sp := range t.spans {
		if root == nil || earlierRoot(sp, root) {
			root = sp
		}
		if sp.End.After(end) {
			end = sp.End
		}
		if sp.Error {
			sum.Errors++
		}
		if sp.HasLane && !contains(sum.Lanes, sp.Requested) {
			sum.Lanes = append(sum.Lanes, sp.Requested)
		}
		if !contains(sum.Services, sp.Service) {
			sum.Services = append(sum.Services, sp.Service)
		}
	}
	if root != nil {
		sum.Root, sum.Service, sum.Start = root.Name, root.Service, root.Start
		sum.Duration = adminapi.Duration(end.Sub(root.Start))
	}
	sort.Strings(sum.Lanes)
	sort.Strings(sum.Services)
	return sum
}

// earlierRoot reports whether a is a better root than b: a span without a parent beats one with
// a parent; between two of the same kind, the earlier start wins.
func earlierRoot(a, b *Span) bool {
	if (a.ParentID == "") != (b.ParentID == "") {
		return a.ParentID == ""
	}
	return a.Start.Before(b.Start)
}

// Stats returns the store's size and what it dropped.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Traces: len(s.traces), Spans: s.spans, Bytes: s.bytes, Limits: s.limits, Dropped: s.dropped}
}

// each calls f for every stored span, under the store's lock; f must not call the store.
func (s *Store) each(f func(*Span)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.traces {
		for _, sp := range t.spans {
			f(sp)
		}
	}
}

// view runs f with the trace of id (nil when absent) under the store's lock.
func (s *Store) view(id string, f func(t *traceEntry)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s.traces[id])
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}
