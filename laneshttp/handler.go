package laneshttp

import (
	"context"
	"errors"
	"fmt"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lanesdev/lanes/internal/lib/hopspan"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/registry"
)

// Middleware is the server side of lanes: it reads the lane of each incoming
// request into the request's context and, with a guard, refuses requests a
// lane instance must not serve. Handler returns one.
type Middleware struct {
	next   http.Handler
	prop   lane.Propagator
	log    *slog.Logger
	guard  *Guard // nil: none
	exempt []string
	traced http.Handler // otelhttp's handler around serve, when tracing is on

	invalid atomic.Uint64
	refused atomic.Uint64
	logged  atomic.Int64 // when an invalid lane was last logged, in Unix ns
}

// Handler returns a Middleware that serves next.
//
// For each request it reads the lane from the headers with the propagator
// (x-lane, then the lane member of baggage, then aliases) and serves next
// with the request's context carrying it ([lane.FromContext]); calls made
// with that context, through a lanes Transport, stay in the lane.
//
// The lane decided here is the request's lane everywhere below: the
// OpenTelemetry baggage of the context gets the same lane member (none for
// the baseline; see [lane.WithLane]), and when the request has a baggage
// header that says otherwise (an invalid x-lane next to lane=alice, an
// x-lane next to lane=bob, a lane read from an alias next to other
// members), next sees a copy of the headers rewritten by the propagator, so
// that an otelhttp handler inside this one reads the same lane again.
// Otherwise the request's headers are left as they are.
//
// Inside the mesh an invalid lane is ignored: the request is served as a
// baseline request, the event is counted (Middleware.InvalidLanes) and
// logged with slog, at most once a second.
//
// With WithGuard, a lane instance refuses a request whose lane chain does not
// include its lane (a baseline request, or one of another lane) with 421
// Misdirected Request, the header X-Lanes-Error: misdirected, and a message
// naming the lane it serves; requests to the exempt paths
// (DefaultExemptPaths and those of WithExemptPaths) are always served. A
// baseline instance admits every request. Tell the guard its instance with
// Guard.SetInstance (Serve does).
//
// Options: WithPropagator, WithLogger, WithGuard, WithExemptPaths.
func Handler(next http.Handler, opts ...ServerOption) *Middleware {
	return newMiddleware(next, serverConfig(opts))
}

func newMiddleware(next http.Handler, c *config) *Middleware {
	m := &Middleware{next: next, prop: c.prop, log: c.log, exempt: c.exempt, guard: c.guard}
	if tp := c.tracerProvider(); tp != nil {
		// otelhttp's server span around the lanes middleware, which records its decision on it.
		m.traced = otelhttp.NewHandler(http.HandlerFunc(m.serveTraced), "lanes",
			otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagation.TraceContext{}),
			otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method }))
	}
	return m
}

// InvalidLanes returns how many requests carried an invalid lane and were
// served as baseline requests.
func (m *Middleware) InvalidLanes() uint64 { return m.invalid.Load() }

// Refused returns how many requests the guard refused with 421.
func (m *Middleware) Refused() uint64 { return m.refused.Load() }

// Guarded reports whether the middleware has a guard.
func (m *Middleware) Guarded() bool { return m.guard != nil }

// ServeHTTP implements http.Handler.
func (m *Middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if m.traced != nil && !trace.SpanFromContext(r.Context()).IsRecording() {
		m.traced.ServeHTTP(w, r)
		return
	}
	m.serve(w, r, r.Context())
}

// serveTraced serves r inside lanes' own server span, which it offers to an
// inner otelhttp handler (see shareSpan).
func (m *Middleware) serveTraced(w http.ResponseWriter, r *http.Request) {
	m.serve(w, r, shareSpan(r.Context()))
}

// serve serves r, whose context is ctx: the request's, or a child of it
// that the request is given once, with the lane, before next serves it.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, ctx context.Context) {
	span := trace.SpanFromContext(ctx) // lanes' server span, or an outer handler's
	traced := span.IsRecording()
	name, _, err := m.prop.Extract(lane.HTTPHeader(r.Header))
	if err != nil {
		m.invalid.Add(1)
		m.logInvalid(r, err)
	}
	if m.guard != nil {
		exempt := false // admitted only because the path is exempt
		serving, inst, ok := m.guard.Admit(name, func() bool { exempt = m.isExempt(r.URL.Path); return exempt })
		if traced {
			hopspan.RecordServer(span, name, serving, ok, exempt)
		}
		if !ok {
			m.refused.Add(1)
			m.refuse(w, inst, serving, name)
			return
		}
	} else if traced {
		hopspan.RecordServer(span, name, "", true, false)
	}
	ctx = m.prop.EntryContext(ctx, name, lane.HTTPHeader(r.Header))
	r = r.WithContext(ctx)
	if hc := lane.HTTPHeader(r.Header); hc.Values(lane.BaggageHeader) != nil && !lane.BaggageCarries(hc, name) {
		// An OpenTelemetry handler inside this one reads the baggage again
		// from the headers: they must carry the lane decided here. (Without
		// a baggage header it reads none and keeps the context's.)
		h := r.Header.Clone()
		m.prop.InjectLane(name, lane.HTTPHeader(h))
		r.Header = h
	}
	m.next.ServeHTTP(w, r)
}

func (m *Middleware) isExempt(path string) bool {
	for _, p := range m.exempt {
		if strings.HasPrefix(path, p) && (len(path) == len(p) || path[len(p)] == '/' || strings.HasSuffix(p, "/")) {
			return true
		}
	}
	return false
}

func (m *Middleware) refuse(w http.ResponseWriter, inst *registry.Instance, serving, requestLane string) {
	h := w.Header()
	h.Set(ErrorHeader, CodeMisdirected)
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusMisdirectedRequest)
	what := "a baseline request"
	if requestLane != "" {
		what = fmt.Sprintf("a request in lane %q", requestLane)
	}
	fmt.Fprintf(w, "%s: this instance of %q serves lane %q, and %s does not reach it\n",
		CodeMisdirected, inst.Service, serving, what)
}

func (m *Middleware) logInvalid(r *http.Request, err error) {
	now := time.Now().UnixNano()
	last := m.logged.Load()
	if now-last < int64(time.Second) || !m.logged.CompareAndSwap(last, now) {
		return
	}
	var ne *lane.NameError
	if !errors.As(err, &ne) {
		m.log.WarnContext(r.Context(), "lanes: lane not read; serving as baseline", "err", err)
		return
	}
	v := ne.Value
	if len(v) > 80 {
		v = v[:80] + "..."
	}
	m.log.WarnContext(r.Context(), "lanes: invalid lane ignored; serving as baseline",
		"header", ne.Header, "rule", string(ne.Rule), "value", v, "invalid_total", m.invalid.Load())
}
