package admin

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the admin API's Prometheus metrics, in a registry of their
// own so that several servers can live in one process (tests).
type metrics struct {
	reg           *prometheus.Registry
	requests      *prometheus.CounterVec
	duration      *prometheus.HistogramVec
	registrations *prometheus.CounterVec
	heartbeats    *prometheus.CounterVec
	authFailures  prometheus.Counter
}

func newMetrics(claims *ClaimTable) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lanes_admin_requests_total",
			Help: "Admin API requests, by endpoint and HTTP status.",
		}, []string{"endpoint", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "lanes_admin_request_duration_seconds",
			Help:    "Time to answer admin API requests (watch streams excluded), by endpoint.",
			Buckets: prometheus.DefBuckets,
		}, []string{"endpoint"}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lanes_registrations_total",
			Help: "Registrations through the admin API, by result: created, updated, replaced (held by another registration), refused.",
		}, []string{"result"}),
		heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lanes_heartbeats_total",
			Help: "Registration heartbeats, by result: ok, expired (the registration was gone), lane_expired, refused.",
		}, []string{"result"}),
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lanes_admin_auth_failures_total",
			Help: "Requests refused for a missing, unknown or wrong token.",
		}),
	}
	m.reg.MustRegister(m.requests, m.duration, m.registrations, m.heartbeats, m.authFailures)
	if claims != nil {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "lanes_claims",
			Help: "Client-IP claims in force at the gateway.",
		}, func() float64 { return float64(claims.Len()) }))
	}
	return m
}

func (m *metrics) gatherer(extra prometheus.Gatherer) prometheus.Gatherer {
	if extra == nil {
		return m.reg
	}
	return prometheus.Gatherers{m.reg, extra}
}

// instrument is the outer wrapper of the API (nothing to do yet: label
// measures each endpoint).
func (m *metrics) instrument(h http.Handler) http.Handler { return h }

// label counts and times the requests of one endpoint.
func (m *metrics) label(endpoint string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(sw, r)
		m.requests.WithLabelValues(endpoint, strconv.Itoa(sw.status)).Inc()
		if endpoint != "GET /v1/watch/instances" {
			m.duration.WithLabelValues(endpoint).Observe(time.Since(start).Seconds())
		}
		if sw.status == http.StatusUnauthorized {
			m.authFailures.Inc()
		}
	})
}

// statusWriter remembers the status of an answer. It passes Flush through,
// for watch streams.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
