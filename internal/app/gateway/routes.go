package gateway

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/registry"
	"github.com/lanesdev/lanes/routing"
)

// Route maps requests to a service: adminapi.Route, the one type that the
// control plane's settings, the gateway and GET /v1/info share.
type Route = adminapi.Route

// route is a validated Route with its service handle.
type route struct {
	Route
	prefix string // Prefix without its trailing "/" ("" for "/")
	svc    *routing.Service
}

// validateRoutes checks routes and returns them compiled. Errors are
// *ConfigError, naming the route, its part and the value.
func validateRoutes(rs []Route) ([]route, error) {
	out := make([]route, 0, len(rs))
	for i, r := range rs {
		part := func(part, format string, args ...any) error {
			e := fieldError("routes", i, format, args...)
			e.Part = part
			return e
		}
		if err := registry.CheckService(r.Service); err != nil {
			return nil, part("service", "invalid service %q: %s", r.Service, err.(*registry.FieldError).Msg)
		}
		if r.Host != "" {
			h := strings.ToLower(r.Host)
			if err := checkHost(h); err != nil {
				return nil, part("host", "invalid host %q: %v", r.Host, err)
			}
			r.Host = h
		}
		if r.Prefix != "" {
			if err := checkPrefix(r.Prefix); err != nil {
				return nil, part("prefix", "invalid path prefix %q: %v", r.Prefix, err)
			}
		} else if r.StripPrefix {
			return nil, part("strip_prefix", "set without a prefix")
		}
		c := route{Route: r, prefix: strings.TrimSuffix(r.Prefix, "/")}
		for j, p := range out {
			if p.Host == c.Host && p.prefix == c.prefix {
				e := fieldError("routes", i, "host %q and prefix %q are those of routes[%d], so it can never match", r.Host, r.Prefix, j)
				e.Shadowed = j
				return nil, e
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// checkHost accepts a lower-case DNS name or IP literal without a port.
func checkHost(h string) error {
	if strings.Contains(h, "://") {
		return fmt.Errorf("want a host name without a scheme")
	}
	if len(h) > 253 {
		return fmt.Errorf("longer than 253 characters")
	}
	if strings.HasPrefix(h, "[") || strings.Count(h, ":") > 1 {
		return fmt.Errorf("want a host name, not an IPv6 literal")
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '.', c == '_':
		case c == ':':
			return fmt.Errorf("want a host name without a port")
		default:
			return fmt.Errorf("character %q is not allowed in a host name", c)
		}
	}
	if h[0] == '.' || h[len(h)-1] == '.' || strings.Contains(h, "..") {
		return fmt.Errorf("empty label")
	}
	return nil
}

// checkPrefix accepts an absolute, clean URL path.
func checkPrefix(p string) error {
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("must start with \"/\"")
	}
	if strings.ContainsAny(p, "?#") {
		return fmt.Errorf("must not hold a query or a fragment")
	}
	u, err := url.Parse(p)
	if err != nil || u.Path != p {
		return fmt.Errorf("must be a plain path, not percent-encoded")
	}
	for _, seg := range strings.Split(strings.Trim(p, "/"), "/") {
		if seg == "." || seg == ".." {
			return fmt.Errorf("must not hold dot segments")
		}
	}
	if strings.Contains(p, "//") {
		return fmt.Errorf("must not hold empty segments")
	}
	return nil
}

// betterRoute reports whether r, which matches a request as best does, is
// the more specific of the two: a route on a host beats one without a host,
// then the longer prefix wins.
func betterRoute(r, best *route) bool {
	if (r.Host != "") != (best.Host != "") {
		return r.Host != ""
	}
	return len(r.prefix) > len(best.prefix)
}

// matchPath reports whether path matches the segment prefix p (a Prefix
// without its trailing "/"; "" matches everything).
func matchPath(path, p string) bool {
	if p == "" {
		return true
	}
	if !strings.HasPrefix(path, p) {
		return false
	}
	return len(path) == len(p) || path[len(p)] == '/'
}

// strip removes the segment prefix p from path, keeping a leading "/".
func strip(path, p string) string {
	rest := path[len(p):]
	if rest == "" {
		return "/"
	}
	return rest
}

// stripURL removes the route's prefix from u's path (and raw path).
func stripURL(u *url.URL, p string) {
	if p == "" || !matchPath(u.Path, p) {
		return
	}
	u.Path = strip(u.Path, p)
	if u.RawPath != "" {
		if matchPath(u.RawPath, p) {
			u.RawPath = strip(u.RawPath, p)
		} else {
			u.RawPath = "" // re-escaped from Path
		}
	}
}
