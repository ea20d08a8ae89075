package sidecar

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/lanesdev/lanes/internal/app/gateway"
	"github.com/lanesdev/lanes/internal/lib/routedcall"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
)

// traceContext reads and writes the W3C traceparent header.
var traceContext propagation.TraceContext

// inbound is the handler of the inbound listener: laneshttp's server
// middleware (the lane of the request, the guard and its exempt paths, the
// server span) around a reverse proxy to the app. The app receives the
// lane decided here (x-lane and baggage, as the transports write them), the
// forwarding headers (X-Forwarded-For with the caller appended) and,
// when the request is traced, the traceparent of the sidecar's server span:
// the parent of the calls the app makes with them.
func (s *Sidecar) inbound() http.Handler {
	app := &url.URL{Scheme: "http", Host: s.cfg.App}
	var prop lane.Propagator
	rp := &httputil.ReverseProxy{
		BufferPool: gateway.CopyBuffers,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(app)
			pr.Out.Host = pr.In.Host
			// The forwarding headers of the hop before (the gateway's) are
			// kept: the client's address first, the original host and scheme.
			in := pr.In.Header
			pr.Out.Header["X-Forwarded-For"] = in["X-Forwarded-For"]
			pr.SetXForwarded()
			for _, k := range [...]string{"X-Forwarded-Host", "X-Forwarded-Proto"} {
				if v := in[k]; len(v) > 0 {
					pr.Out.Header[k] = v
				}
			}
			ctx := pr.In.Context()
			prop.InjectCall(ctx, lane.FromContext(ctx), lane.HTTPHeader(pr.Out.Header))
			traceContext.Inject(ctx, propagation.HeaderCarrier(pr.Out.Header))
		},
		Transport: &http.Transport{
			Proxy:                 nil, // straight to the app, whatever HTTP_PROXY says
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:          256,
			MaxIdleConnsPerHost:   256,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: routedcall.DefaultResponseHeaderTimeout,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the caller went away
			}
			s.log.Warn("lanes sidecar: the app did not answer", "app", s.cfg.App, "method", r.Method, "path", r.URL.Path, "err", err)
			if op := (*net.OpError)(nil); errors.As(err, &op) && op.Op == "dial" {
				// The app is not there: the instance is down, and the caller
				// hears it as from a dead instance (the connection closed
				// without an answer), so that a lanes caller moves the call
				// on to another instance, as it would a 502 it does not
				// retry. The call never reached the app.
				panic(http.ErrAbortHandler)
			}
			plain(w, http.StatusBadGateway, fmt.Sprintf("lanes sidecar: the app of %q at %s did not answer: %v\n", s.cfg.Service, s.cfg.App, err))
		},
	}
	return laneshttp.Handler(rp, laneshttp.WithGuard(s.guard), laneshttp.WithLogger(s.log),
		laneshttp.WithTracerProvider(s.cfg.TracerProvider))
}

// plain writes a text answer of the sidecar's own.
func plain(w http.ResponseWriter, status int, msg string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	fmt.Fprint(w, msg)
}
