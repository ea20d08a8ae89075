package gateway

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the gateway's counters. They exist whether or not they are
// registered, so that the request path does not test for them.
type metrics struct {
	sources [nSrc]prometheus.Counter
	servedV *prometheus.CounterVec
	servedC sync.Map // lane -> prometheus.Counter
	errorsV *prometheus.CounterVec
	errorsC sync.Map // code -> prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{}
	sources := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "lanes", Subsystem: "gateway", Name: "requests_total",
		Help: "Requests routed by the gateway, by the source that assigned their lane (baseline: none).",
	}, []string{"source"})
	m.servedV = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "lanes", Subsystem: "gateway", Name: "served_total",
		Help: "Requests proxied by the gateway, by the lane of the instance that served them.",
	}, []string{"lane"})
	m.errorsV = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "lanes", Subsystem: "gateway", Name: "errors_total",
		Help: "Requests the gateway answered with an error of its own, by x-lanes-error code.",
	}, []string{"code"})
	for i := range m.sources {
		m.sources[i] = sources.WithLabelValues(srcNames[i])
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{sources, m.servedV, m.errorsV} {
			if err := reg.Register(c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if errors.As(err, &are) {
					return nil, errors.New("gateway: registerer: the lanes_gateway metrics are already registered; give each gateway its own registerer")
				}
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *metrics) source(s src) { m.sources[s].Inc() }

func (m *metrics) served(lane string) {
	if lane == "" {
		lane = "baseline"
	}
	if c, ok := m.servedC.Load(lane); ok {
		c.(prometheus.Counter).Inc()
		return
	}
	c := m.servedV.WithLabelValues(lane)
	m.servedC.Store(lane, c)
	c.Inc()
}

func (m *metrics) errors(code string) {
	if c, ok := m.errorsC.Load(code); ok {
		c.(prometheus.Counter).Inc()
		return
	}
	c := m.errorsV.WithLabelValues(code)
	m.errorsC.Store(code, c)
	c.Inc()
}
