package gateway

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/registry"
)

// A ConfigError is a bad field of a Config. Field is spelled as in a
// configuration file (routes, domain, lane_cookie, ...).
type ConfigError struct {
	// Field is the Config field, such as "routes" or "lane_cookie".
	Field string
	// Index is the entry of a list field, or -1.
	Index int
	// Part is the part of a route that is wrong ("service", "host",
	// "prefix", "strip_prefix"), or "".
	Part string
	// Shadowed is, for a route that can never match, the index of the
	// earlier route that matches all it would; else -1.
	Shadowed int
	// Msg says what is wrong, with the value.
	Msg string
}

func (e *ConfigError) Error() string {
	f := e.Field
	if e.Index >= 0 {
		f += fmt.Sprintf("[%d]", e.Index)
	}
	if e.Part != "" {
		f += "." + e.Part
	}
	return "gateway: " + f + ": " + e.Msg
}

func fieldError(field string, index int, format string, args ...any) *ConfigError {
	return &ConfigError{Field: field, Index: index, Shadowed: -1, Msg: fmt.Sprintf(format, args...)}
}

// Validate checks cfg as New does, but without an engine (Engine is not
// looked at) and without starting or registering anything, so that a
// program can refuse a bad configuration before it starts any part. Its
// errors are *ConfigError.
func (cfg Config) Validate() error {
	_, err := compile(cfg)
	return err
}

// compile validates every field of cfg but Engine and returns the gateway
// they describe, not yet wired to an engine.
func compile(cfg Config) (*Gateway, error) {
	routes, err := validateRoutes(cfg.Routes)
	if err != nil {
		return nil, err
	}
	g := &Gateway{
		routes:     routes,
		claims:     cfg.Claims,
		zone:       cfg.Zone,
		host:       cfg.Host,
		log:        cfg.Logger,
		laneCookie: cfg.LaneCookie,
		keyHeader:  cfg.KeyHeader,
		keyCookie:  cfg.KeyCookie,
		preserve:   cfg.PreserveHost,
		readyWait:  cfg.ReadyTimeout,
		drained:    make(chan struct{}),
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	if g.host == "" {
		g.host = registry.LocalHost(nil)
	}
	if cfg.Domain != "" {
		d := strings.ToLower(strings.TrimSpace(cfg.Domain))
		if err := checkHost(d); err != nil {
			return nil, fieldError("domain", -1, "invalid domain %q: %v", cfg.Domain, err)
		}
		g.domain = d
	}
	for i, p := range cfg.TrustedProxies {
		if !p.IsValid() {
			return nil, fieldError("trusted_proxies", i, "invalid prefix %q", p)
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		g.trusted = append(g.trusted, p.Masked())
	}
	for i, a := range cfg.Aliases {
		if !validHeader(a) {
			return nil, fieldError("aliases", i, "invalid header name %q", a)
		}
		if strings.EqualFold(a, lane.Header) || strings.EqualFold(a, lane.BaggageHeader) {
			return nil, fieldError("aliases", i, "%q is read anyway; list only other headers", a)
		}
		g.aliases = append(g.aliases, http.CanonicalHeaderKey(a))
	}
	g.prop = lane.Propagator{Aliases: slices.Clone(cfg.Aliases)}
	g.stripped = append([]string{lane.Header, hRealIP}, g.aliases...)
	if g.laneCookie == "" {
		g.laneCookie = DefaultLaneCookie
	} else if !validHeader(g.laneCookie) {
		return nil, fieldError("lane_cookie", -1, "invalid cookie name %q", cfg.LaneCookie)
	}
	if g.keyHeader == "" {
		g.keyHeader = DefaultKeyHeader
	} else if !validHeader(g.keyHeader) {
		return nil, fieldError("key_header", -1, "invalid header name %q", cfg.KeyHeader)
	}
	g.keyHeader = http.CanonicalHeaderKey(g.keyHeader)
	if g.keyCookie == "" {
		g.keyCookie = DefaultKeyCookie
	} else if !validHeader(g.keyCookie) {
		return nil, fieldError("key_cookie", -1, "invalid cookie name %q", cfg.KeyCookie)
	}
	if g.on, err = parseSources(cfg.Disable); err != nil {
		return nil, err
	}
	if cfg.MaxIdleConnsPerHost < 0 {
		return nil, fieldError("max_idle_conns_per_host", -1, "%d is negative", cfg.MaxIdleConnsPerHost)
	}
	if cfg.UpstreamIdleTimeout < 0 {
		return nil, fieldError("upstream_idle_timeout", -1, "%s is negative; 0 means the default, %s", cfg.UpstreamIdleTimeout, DefaultUpstreamIdleTimeout)
	}
	if cfg.ClientIdleTimeout < 0 {
		return nil, fieldError("client_idle_timeout", -1, "%s is negative; 0 means the default, %s", cfg.ClientIdleTimeout, DefaultClientIdleTimeout)
	}
	if cfg.ClientHeaderTimeout < 0 {
		return nil, fieldError("client_header_timeout", -1, "%s is negative; 0 means the default, %s", cfg.ClientHeaderTimeout, DefaultClientHeaderTimeout)
	}
	if cfg.MaxConns < 0 {
		return nil, fieldError("max_conns", -1, "%d is negative; 0 means the default, a quarter of the open-file limit (now %d)", cfg.MaxConns, DefaultMaxConns())
	}
	if cfg.ReadyTimeout < 0 {
		return nil, fieldError("ready_timeout", -1, "%s is negative", cfg.ReadyTimeout)
	}
	switch cfg.HTTP1 {
	case "", HTTP1Fast:
		g.fast = true
	case HTTP1Std:
	default:
		return nil, fieldError("http1", -1, "unknown stack %q: want %q or %q", cfg.HTTP1, HTTP1Fast, HTTP1Std)
	}
	if g.readyWait == 0 {
		g.readyWait = DefaultReadyTimeout
	}
	return g, nil
}
