package sidecar

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/lanesmetrics"
	"github.com/lanesdev/lanes/registry"
)

// Defaults of the settings that Config leaves zero.
const (
	// DefaultProxy is where the outbound proxy listens: a loopback port of
	// the system's choosing, printed at start.
	DefaultProxy = "127.0.0.1:0"
	// DefaultDrain is how long the inbound listener serves on after the
	// instance is deregistered, while callers learn that it is gone.
	DefaultDrain = time.Second
	// DefaultReadyInterval is how often the app's readiness is checked.
	DefaultReadyInterval = time.Second
	// DefaultReadyTimeout bounds one readiness check.
	DefaultReadyTimeout = 2 * time.Second
	// DefaultReadyFailures is how many readiness checks in a row must fail
	// before the instance is deregistered.
	DefaultReadyFailures = 3
	// DefaultShutdownTimeout bounds the graceful shutdown of each listener.
	DefaultShutdownTimeout = 10 * time.Second
	// MinTTL is the shortest registration TTL a sidecar takes.
	MinTTL = time.Second
	// maxReadyPath bounds --ready-path.
	maxReadyPath = 1024
)

// Config is what a sidecar runs with. Every field that names a flag of
// `lanes sidecar` is checked by Validate, whose errors name the flag.
type Config struct {
	Service string // --service: the service the app is an instance of
	Lane    string // --lane: its lane; "" for the baseline
	// Listen is the inbound listener (--listen), which the instance is
	// registered at unless Advertise says otherwise. Not with Direct.
	Listen string
	App    string // --app: host:port of the app
	// Proxy is the outbound proxy's listener (--proxy), on loopback only.
	// "" means DefaultProxy.
	Proxy string
	// Advertise is the address registered (--advertise): by default the
	// inbound listener's (with Direct, App).
	Advertise string
	// ReadyPath, when set, is the path of the app that answers 2xx or 3xx
	// when it is ready (--ready-path); otherwise a TCP connection to App
	// is the check.
	ReadyPath string
	// Direct registers App itself and takes no inbound traffic (--direct).
	Direct bool
	// PassThrough sends outbound requests to hosts that are not lanes
	// services on, as a plain proxy (--pass-through); otherwise they are
	// refused with 502.
	PassThrough bool

	TTL           time.Duration // --ttl: the registration's lease (0: registry.DefaultTTL)
	Drain         time.Duration // --drain (0: DefaultDrain; negative: none)
	ReadyInterval time.Duration // --ready-interval (0: DefaultReadyInterval)
	MaxConns      int           // --max-conns: on each listener (0: accept.Share's default)

	// Out receives the start-up lines; Logger the logs (default
	// slog.Default()).
	Out    io.Writer
	Logger *slog.Logger
	// Getenv reads the LANES_* variables of the instance (registry.ApplyEnv:
	// LANES_ZONE, LANES_LABELS, ...; LANES_LANE is not read: Lane is the
	// lane). Default os.Getenv.
	Getenv func(string) string
	// TracerProvider traces both directions; nil is lanestrace's (which
	// lanesenv.Open sets from LANES_TRACES).
	TracerProvider trace.TracerProvider
	// Metrics counts the outbound calls' routing decisions, when set;
	// Gatherer, when set, is served as GET /metrics on the outbound proxy's
	// own address (http://127.0.0.1:PORT/metrics).
	Metrics  *lanesmetrics.Requests
	Gatherer prometheus.Gatherer
}

// FieldError is a setting that Validate refuses: the flag, the value as
// given and what is wrong.
type FieldError struct {
	Flag  string // such as "--app"
	Value string
	Msg   string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s %q: %s", e.Flag, e.Value, e.Msg) }

func fieldErr(flag, value, format string, args ...any) *FieldError {
	return &FieldError{Flag: flag, Value: value, Msg: fmt.Sprintf(format, args...)}
}

// Validate checks every setting, and starts nothing. Its errors are
// *FieldError.
func (c Config) Validate() error {
	if err := registry.CheckService(c.Service); err != nil {
		if c.Service == "" {
			return fieldErr("--service", c.Service, "required: the service the app is an instance of")
		}
		msg := err.Error()
		if fe, ok := err.(*registry.FieldError); ok {
			msg = fe.Msg
		}
		return fieldErr("--service", c.Service, "%s", msg)
	}
	if c.Lane != "" {
		if _, err := lane.Parse(c.Lane); err != nil {
			return fieldErr("--lane", c.Lane, "%v", err)
		}
	}
	if c.App == "" {
		return fieldErr("--app", c.App, "required: host:port of the app, such as 127.0.0.1:8081")
	}
	if err := registry.CheckAddr(c.App); err != nil {
		return fieldErr("--app", c.App, "%v", err)
	}
	if c.Direct {
		if c.Listen != "" {
			return fieldErr("--listen", c.Listen, "--direct takes no inbound traffic: leave --listen out (the app's own address, or --advertise, is registered)")
		}
	} else {
		if c.Listen == "" {
			return fieldErr("--listen", c.Listen, "required: host:port of the inbound listener, such as 0.0.0.0:8080 (port 0: any), unless --direct")
		}
		if err := checkListen(c.Listen); err != nil {
			return fieldErr("--listen", c.Listen, "%v", err)
		}
		if c.Listen == c.App {
			return fieldErr("--listen", c.Listen, "is the app's address (--app): the sidecar listens beside the app, on a port of its own")
		}
	}
	proxy := c.Proxy
	if proxy == "" {
		proxy = DefaultProxy
	}
	if err := checkListen(proxy); err != nil {
		return fieldErr("--proxy", c.Proxy, "%v", err)
	}
	if !loopback(proxy) {
		return fieldErr("--proxy", c.Proxy, "the outbound proxy listens on loopback only (127.0.0.1:PORT or [::1]:PORT): whoever reaches it calls the mesh as this service")
	}
	if c.Advertise != "" {
		if err := registry.CheckAddr(c.Advertise); err != nil {
			return fieldErr("--advertise", c.Advertise, "%v", err)
		}
	}
	if c.ReadyPath != "" {
		if err := checkPath(c.ReadyPath); err != nil {
			return fieldErr("--ready-path", c.ReadyPath, "%v", err)
		}
	}
	if c.TTL != 0 && c.TTL < MinTTL {
		return fieldErr("--ttl", c.TTL.String(), "at least %s", MinTTL)
	}
	if c.ReadyInterval < 0 {
		return fieldErr("--ready-interval", c.ReadyInterval.String(), "must be positive")
	}
	if c.MaxConns < 0 {
		return fieldErr("--max-conns", strconv.Itoa(c.MaxConns), "must be 0 (the default) or more")
	}
	return nil
}

// checkListen checks a listener's address: an IP literal (or empty, or
// localhost) and a port of 0..65535.
func checkListen(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("not host:port")
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("port %q is not within 0..65535", port)
	}
	if host != "" && host != "localhost" {
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Errorf("host %q is not an IP address", host)
		}
	}
	return nil
}

// loopback reports whether a listener's address (checked) is on loopback.
func loopback(addr string) bool {
	host, _, _ := net.SplitHostPort(addr)
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// checkPath checks a readiness path: an absolute path (with an optional
// query) of printable ASCII, as it goes on a request line.
func checkPath(p string) error {
	if len(p) > maxReadyPath {
		return fmt.Errorf("longer than %d bytes", maxReadyPath)
	}
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("want an absolute path, such as /healthz")
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c <= ' ' || c >= 0x7f || c == '#' {
			return fmt.Errorf("byte %d (%q) cannot be in a request path", i, c)
		}
	}
	if _, err := url.ParseRequestURI(p); err != nil {
		return fmt.Errorf("not a request path: %v", err)
	}
	return nil
}
