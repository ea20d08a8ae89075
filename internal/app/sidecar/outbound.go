package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/propagation"

	"github.com/lanesdev/lanes/internal/app/gateway"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/laneshttp"
	"github.com/lanesdev/lanes/routing"
)

// via marks the requests the outbound proxy passes through to hosts that are
// not lanes services, so that one that comes back to it (a proxy of the
// sidecar's own environment that is the sidecar) is refused, not looped.
const via = "1.1 lanes-sidecar"

// targetKey holds, in a request's context, the host its call goes to.
type targetKey struct{}

// outbound is the handler of the outbound proxy: the app's calls, in
// absolute form (HTTP_PROXY) or with the service as the Host, routed by
// laneshttp.Transport (the routed-call step, its client span and metrics)
// behind a reverse proxy, in the lane the request carries.
func (s *Sidecar) outbound() http.Handler {
	opts := []laneshttp.ClientOption{laneshttp.WithEnv(s.cfg.Getenv), laneshttp.WithTracerProvider(s.cfg.TracerProvider)}
	if s.cfg.Metrics != nil {
		opts = append(opts, laneshttp.WithMetrics(s.cfg.Metrics))
	}
	if !s.cfg.PassThrough {
		opts = append(opts, laneshttp.WithRefuseOthers())
	}
	rp := &httputil.ReverseProxy{
		BufferPool: gateway.CopyBuffers,
		Rewrite: func(pr *httputil.ProxyRequest) {
			target := pr.In.Context().Value(targetKey{}).(string)
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = target
			pr.Out.Host = ""
			if !laneshttp.SingleLabel(target) {
				pr.Out.Header.Add("Via", via)
			}
		},
		Transport:    laneshttp.NewTransport(s.engine, opts...),
		ErrorHandler: s.outboundError,
	}
	var metrics http.Handler
	if s.cfg.Gatherer != nil {
		metrics = promhttp.HandlerFor(s.cfg.Gatherer, promhttp.HandlerOpts{})
	}
	own := s.proxyLn.Addr().String()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		target, status, msg := s.target(r, own)
		if status != 0 {
			if status == http.StatusNotFound && metrics != nil && r.Method == http.MethodGet && r.URL.Path == "/metrics" {
				metrics.ServeHTTP(w, r)
				return
			}
			plain(w, status, msg)
			return
		}
		var prop lane.Propagator
		ctx := prop.ExtractContext(r.Context(), lane.HTTPHeader(r.Header))
		ctx = traceContext.Extract(ctx, propagation.HeaderCarrier(r.Header))
		rp.ServeHTTP(w, r.WithContext(context.WithValue(ctx, targetKey{}, target)))
	})
}

// target decides where an outbound request goes: the service it names (its
// host without a port), or with PassThrough another host as it is. A request
// it refuses gets a status and a message.
func (s *Sidecar) target(r *http.Request, own string) (target string, status int, msg string) {
	if r.Method == http.MethodConnect {
		return "", http.StatusMethodNotAllowed, "lanes sidecar: CONNECT is not supported: the outbound proxy routes plain HTTP calls to lanes services (http://SERVICE/...); HTTPS egress does not go through it\n"
	}
	host := r.Host
	if r.URL.IsAbs() {
		if !strings.EqualFold(r.URL.Scheme, "http") {
			return "", http.StatusBadRequest, fmt.Sprintf("lanes sidecar: scheme %q: the outbound proxy takes http:// calls only\n", r.URL.Scheme)
		}
		host = r.URL.Host
	}
	name := strings.ToLower(trimPort(host))
	switch {
	case host == "":
		return "", http.StatusBadRequest, "lanes sidecar: the request names no host: call http://SERVICE/... through the proxy, or set the Host header to the service\n"
	case host == own || r.Host == own && !r.URL.IsAbs():
		return "", http.StatusNotFound, fmt.Sprintf("lanes sidecar: %s is the outbound proxy itself: call http://SERVICE/... through it (HTTP_PROXY=http://%s), or set the Host header to the service\n", own, own)
	case laneshttp.SingleLabel(name):
		return name, 0, ""
	case !s.cfg.PassThrough:
		return "", http.StatusBadGateway, fmt.Sprintf("lanes sidecar: %q is not a lanes service (a service is a bare name, such as http://orders/); the sidecar routes calls to lanes services only (--pass-through sends other hosts on)\n", host)
	}
	for _, v := range r.Header.Values("Via") {
		if strings.Contains(v, "lanes-sidecar") {
			return "", http.StatusLoopDetected, fmt.Sprintf("lanes sidecar: the call to %q came back to the sidecar that passed it through (a proxy loop)\n", host)
		}
	}
	return host, 0, ""
}

// outboundError answers a call that failed: a routing failure as laneshttp
// answers it (503 with X-Lanes-Error), anything else 502 with the error.
func (s *Sidecar) outboundError(w http.ResponseWriter, r *http.Request, err error) {
	if laneshttp.WriteError(w, err) {
		return
	}
	if r.Context().Err() != nil {
		return // the caller went away
	}
	target, _ := r.Context().Value(targetKey{}).(string)
	if errors.Is(err, laneshttp.ErrNotService) {
		plain(w, http.StatusBadGateway, fmt.Sprintf("lanes sidecar: %q is not a lanes service\n", target))
		return
	}
	s.log.Warn("lanes sidecar: outbound call failed", "target", target, "method", r.Method, "path", r.URL.Path, "err", err)
	plain(w, http.StatusBadGateway, fmt.Sprintf("lanes sidecar: the call to %q failed: %v\n", target, err))
}

// Outbound is the outbound proxy alone, for a process that has no app of
// its own to register and routes the calls of the processes beside it
// (lanes dev): calls to http://SERVICE/... (absolute, as HTTP_PROXY sends
// them, or with the service as the Host) routed by laneshttp.Transport on
// engine, in the lane each carries; other hosts are refused. own is the
// address it is served at (a call to it is answered 404, not looped).
func Outbound(engine *routing.Engine, own net.Addr, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.Default()
	}
	s := &Sidecar{cfg: Config{Getenv: os.Getenv}, log: log, engine: engine, proxyLn: held{addr: own}}
	return s.outbound()
}
