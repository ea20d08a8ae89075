package laneshttp

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/lanesdev/lanes/routing"
)

// ErrorHeader is the response header in which lanes names the reason of its
// own refusals: a routing code ("no_instance", "lane_unavailable") on the 503
// of WriteError, CodeMisdirected on the 421 of the guard.
const ErrorHeader = "X-Lanes-Error"

// CodeMisdirected is the ErrorHeader value of the guard's 421 Misdirected
// Request.
const CodeMisdirected = "misdirected"

// WriteError writes the HTTP answer to a routing failure: when err wraps a
// [*routing.Error], it writes a 503 Service Unavailable whose ErrorHeader is
// the error's code and whose body is the error's message, which names the
// code, the service and the lane, and it returns true. For any other error it
// writes nothing and returns false.
//
//	res, err := client.Do(req)
//	if err != nil {
//		if !laneshttp.WriteError(w, err) {
//			http.Error(w, "bad gateway", http.StatusBadGateway)
//		}
//		return
//	}
func WriteError(w http.ResponseWriter, err error) bool {
	var re *routing.Error
	if !errors.As(err, &re) {
		return false
	}
	h := w.Header()
	h.Set(ErrorHeader, string(re.Code))
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusServiceUnavailable)
	fmt.Fprintln(w, re.Error())
	return true
}

// ProxyErrorHandler has the shape of [httputil.ReverseProxy.ErrorHandler],
// for a proxy whose Transport is a lanes Transport. A routing failure is
// answered as WriteError does (503); any other error is answered 502 Bad
// Gateway and logged with slog (unless the client went away), as the proxy's
// default handler does.
func ProxyErrorHandler(w http.ResponseWriter, r *http.Request, err error) {
	if WriteError(w, err) {
		return
	}
	if r.Context().Err() == nil { // not worth a line when the client went away
		slog.Default().WarnContext(r.Context(), "lanes: proxy error", "method", r.Method, "url", r.URL.String(), "err", err)
	}
	w.WriteHeader(http.StatusBadGateway)
}
