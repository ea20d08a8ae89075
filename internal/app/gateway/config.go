package gateway

import (
	"cmp"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/lanesdev/lanes/internal/lib/routedcall"
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
// errors are *ConfigError. Every check of a Config is made here (through
// compile); every default is set by provision.
func (cfg Config) Validate() error {
	_, err := compile(cfg)
	return err
}

// settings are the values that a gateway runs with, from its Config, with
// every default set (provision).
type settings struct {
	host       string
	log        *slog.Logger
	laneCookie string
	keyHeader  string // canonical
	keyCookie  string
	fast       bool // HTTP/1.1 on fasthttp (Config.HTTP1)
	// The timeouts, each 0 for none.
	readyWait     time.Duration // Config.ReadyTimeout
	headerTimeout time.Duration // the response-header timeout
	writeTimeout  time.Duration // each write to an instance
	readTimeout   time.Duration // each read of an answer's body
	clientWrite   time.Duration // each write to a client
	clientRead    time.Duration // each read of a request's body
	upIdle        time.Duration // an idle connection to an instance
	clientIdle    time.Duration // a client's idle keep-alive connection
	clientHeader  time.Duration // the read of a request head
	// maxConns caps the open client connections of each Serve; idle bounds
	// the idle connections kept per instance.
	maxConns, idle int
	// call is how the routed calls are made (Gateway.routed): the retries
	// (Config.Retries), the response-header timeout and the client span;
	// New gives it the engine.
	call routedcall.Config
}

// provision returns the settings of cfg, which Validate has accepted: the
// one place where a field left zero gets its default. Every timeout reads
// its field one way (routedcall.Timeout): 0 means the default, a negative
// value none; so does Retries.
func provision(cfg Config) settings {
	s := settings{
		host:          cmp.Or(cfg.Host, registry.LocalHost(nil)),
		log:           cfg.Logger,
		laneCookie:    cmp.Or(cfg.LaneCookie, DefaultLaneCookie),
		keyHeader:     http.CanonicalHeaderKey(cmp.Or(cfg.KeyHeader, DefaultKeyHeader)),
		keyCookie:     cmp.Or(cfg.KeyCookie, DefaultKeyCookie),
		fast:          cfg.HTTP1 != HTTP1Std,
		readyWait:     routedcall.Timeout(cfg.ReadyTimeout, DefaultReadyTimeout),
		headerTimeout: routedcall.HeaderTimeout(cfg.ResponseHeaderTimeout),
		writeTimeout:  routedcall.Timeout(cfg.UpstreamWriteTimeout, DefaultUpstreamWriteTimeout),
		readTimeout:   routedcall.Timeout(cfg.UpstreamReadTimeout, DefaultUpstreamReadTimeout),
		clientWrite:   routedcall.Timeout(cfg.ClientWriteTimeout, DefaultClientWriteTimeout),
		clientRead:    routedcall.Timeout(cfg.ClientReadTimeout, DefaultClientReadTimeout),
		upIdle:        routedcall.Timeout(cfg.UpstreamIdleTimeout, DefaultUpstreamIdleTimeout),
		clientIdle:    routedcall.Timeout(cfg.ClientIdleTimeout, DefaultClientIdleTimeout),
		clientHeader:  routedcall.Timeout(cfg.ClientHeaderTimeout, DefaultClientHeaderTimeout),
		maxConns:      cmp.Or(cfg.MaxConns, DefaultMaxConns()),
		idle:          cmp.Or(cfg.MaxIdleConnsPerHost, DefaultMaxIdleConnsPerHost),
		// routedcall reads Retries and the timeout as Config does.
		call: routedcall.Config{Retries: cfg.Retries, ResponseHeaderTimeout: cfg.ResponseHeaderTimeout, Tracer: cfg.Tracer},
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	return s
}

// forever stands for no timeout where a server reads 0 as its default.
const forever = 1 << 62

// orForever is d, or forever for none (0).
func orForever(d time.Duration) time.Duration {
	if d == 0 {
		return forever
	}
	return d
}

// compile validates every field of cfg but Engine and returns the gateway
// they describe, provisioned (provision) but not yet wired to an engine.
func compile(cfg Config) (*Gateway, error) {
	routes, err := validateRoutes(cfg.Routes)
	if err != nil {
		return nil, err
	}
	g := &Gateway{
		settings: provision(cfg),
		routes:   routes,
		claims:   cfg.Claims,
		zone:     cfg.Zone,
		preserve: cfg.PreserveHost,
		drained:  make(chan struct{}),
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
	if cfg.LaneCookie != "" && !validHeader(cfg.LaneCookie) {
		return nil, fieldError("lane_cookie", -1, "invalid cookie name %q", cfg.LaneCookie)
	}
	if cfg.KeyHeader != "" && !validHeader(cfg.KeyHeader) {
		return nil, fieldError("key_header", -1, "invalid header name %q", cfg.KeyHeader)
	}
	if cfg.KeyCookie != "" && !validHeader(cfg.KeyCookie) {
		return nil, fieldError("key_cookie", -1, "invalid cookie name %q", cfg.KeyCookie)
	}
	if g.on, err = parseSources(cfg.Disable); err != nil {
		return nil, err
	}
	if cfg.MaxIdleConnsPerHost < 0 {
		return nil, fieldError("max_idle_conns_per_host", -1, "%d is negative", cfg.MaxIdleConnsPerHost)
	}
	if cfg.MaxConns < 0 {
		return nil, fieldError("max_conns", -1, "%d is negative; 0 means the default, a quarter of the open-file limit (now %d)", cfg.MaxConns, DefaultMaxConns())
	}
	switch cfg.HTTP1 {
	case "", HTTP1Fast, HTTP1Std:
	default:
		return nil, fieldError("http1", -1, "unknown stack %q: want %q or %q", cfg.HTTP1, HTTP1Fast, HTTP1Std)
	}
	return g, nil
}
