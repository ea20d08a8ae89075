// Package lanesmetrics counts routed requests for Prometheus: by service, requested lane, served
// lane and reason, with bounded label cardinality. Lanes are short-lived and many (one per
// developer, per pull request), so only the first MaxLanes lanes seen get a label of their own,
// and the first MaxServices services; the rest are counted under "other".
//
//	m, err := lanesmetrics.New(prometheus.DefaultRegisterer)
//	...
//	m.Observe("orders", "alice", "", "no_instance_in_lane")
package lanesmetrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Other is the label value of lanes and services past the bounds.
const Other = "other"

// Baseline is the label value of the baseline (the empty lane).
const Baseline = "baseline"

// Bounds on label values.
const (
	MaxLanes    = 32
	MaxServices = 128
)

// Bound bounds the values of one label fed from outside (a service name, a lane): the first Max
// distinct values get a label of their own, and every later one is counted as Other. It is the
// rule of every metric of lanes whose label values come from outside. It is safe for concurrent
// use.
type Bound struct {
	max int

	mu     sync.Mutex
	seen   map[string]bool
	folded uint64
}

// NewBound returns a Bound that gives max values a label of their own.
func NewBound(max int) *Bound { return &Bound{max: max, seen: map[string]bool{}} }

// Label returns v while the first Max distinct values include it, else Other.
func (b *Bound) Label(v string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.seen[v] {
		return v
	}
	if len(b.seen) < b.max {
		b.seen[v] = true
		return v
	}
	b.folded++
	return Other
}

// Folded returns how many times Label answered Other for a value past the bound.
func (b *Bound) Folded() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.folded
}

// Requests counts routed requests: lanes_requests_total{service, lane_requested, lane_served,
// reason}. Reason is one of lanestrace's fallback reasons. A nil *Requests counts nothing.
type Requests struct {
	vec *prometheus.CounterVec

	mu       sync.RWMutex
	counters map[key]prometheus.Counter
	lanes    *Bound
	services *Bound
}

type key struct{ service, requested, served, reason string }

// New registers lanes_requests_total on reg (nil: prometheus.DefaultRegisterer) and returns its
// counter. Registering twice on one registry returns the counter already registered.
func New(reg prometheus.Registerer) (*Requests, error) {
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lanes_requests_total",
		Help: "Routed requests by service called, lane requested, lane served and reason (lanestrace's fallback reasons). Lanes past the first 32 and services past the first 128 are counted as \"other\".",
	}, []string{"service", "lane_requested", "lane_served", "reason"})
	if err := reg.Register(vec); err != nil {
		are, ok := err.(prometheus.AlreadyRegisteredError)
		if !ok {
			return nil, err
		}
		existing, ok := are.ExistingCollector.(*prometheus.CounterVec)
		if !ok {
			return nil, err
		}
		vec = existing
	}
	return &Requests{vec: vec, counters: map[key]prometheus.Counter{}, lanes: NewBound(MaxLanes), services: NewBound(MaxServices)}, nil
}

// Observe counts one request to service. It takes a read lock and makes no allocation once the
// label combination has been seen.
func (r *Requests) Observe(service, requested, served, reason string) {
	if r == nil {
		return
	}
	k := key{service, requested, served, reason}
	r.mu.RLock()
	c, ok := r.counters[k]
	r.mu.RUnlock()
	if !ok {
		c = r.counter(k)
	}
	c.Inc()
}

func (r *Requests) counter(k key) prometheus.Counter {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.counters[k]; ok {
		return c
	}
	labels := key{r.services.Label(k.service), r.laneLabel(k.requested), r.laneLabel(k.served), k.reason}
	c := r.vec.WithLabelValues(labels.service, labels.requested, labels.served, labels.reason)
	if len(r.counters) < 4*MaxLanes*MaxLanes { // the cache is bounded too
		r.counters[k] = c
	}
	return c
}

func (r *Requests) laneLabel(l string) string {
	if l == "" {
		return Baseline
	}
	return r.lanes.Label(l)
}
