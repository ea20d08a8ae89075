package controlplane

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"path/filepath"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/lanesdev/lanes/internal/app/admin"
	"github.com/lanesdev/lanes/internal/app/collector"
	"github.com/lanesdev/lanes/internal/lib/tlsfiles"
	"github.com/lanesdev/lanes/internal/lib/traceexport"
	"github.com/lanesdev/lanes/lanestrace"
)

// TracesConfig configures the trace collector of lanes up: its OTLP receivers, the bounds of its
// store, and the gateway's own sampling.
type TracesConfig struct {
	// GRPCAddr and HTTPAddr are the OTLP receivers' addresses; "off" runs none.
	GRPCAddr string `yaml:"otlp_grpc_addr"`
	HTTPAddr string `yaml:"otlp_http_addr"`
	// MaxSpans, MaxMiB and MaxAge bound the store; the oldest traces go first.
	MaxSpans int           `yaml:"max_spans"`
	MaxMiB   int64         `yaml:"max_mib"`
	MaxAge   time.Duration `yaml:"max_age"`
	// Sample is the share of baseline requests that the gateway traces (lane requests are
	// always traced); the decision is made at the gateway and honoured downstream.
	Sample float64 `yaml:"sample"`
	// ReceiverAuth says who may send spans (collector.AuthToken, AuthLoopback, AuthOpen).
	ReceiverAuth string `yaml:"receiver_auth"`
	// Token is the telemetry token, which may send any span; empty, it is read from, or
	// created in, <data-dir>/telemetry-token.
	Token string `yaml:"token"`
	// MaxValueBytes cuts span names and attribute values; MaxCheckMiB bounds the integrity
	// checks.
	MaxValueBytes int   `yaml:"max_value_bytes"`
	MaxCheckMiB   int64 `yaml:"max_check_mib"`
}

// TelemetryTokenFile is the file, in the data directory, of the telemetry token.
const TelemetryTokenFile = "telemetry-token"

// newTelemetryToken returns a fresh telemetry token.
func newTelemetryToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return "lanes_telemetry_" + hex.EncodeToString(b)
}

// needsTelemetryFile reports whether the telemetry token is kept in the data directory: the
// collector runs, authenticates by token, and no token is configured.
func (c *Config) needsTelemetryFile() bool {
	t := c.Traces
	return t.Token == "" && t.ReceiverAuth == collector.AuthToken && (t.GRPCAddr != TracesOff || t.HTTPAddr != TracesOff)
}

// TracesOff is the value of an OTLP address that runs no receiver.
const TracesOff = "off"

// Traces is what the collector component provides: the collector, and the tracer provider of
// the control plane's own spans (the gateway's), which exports to the collector.
type Traces struct {
	Collector *collector.Collector
	Provider  trace.TracerProvider
	// GRPCAddr is the OTLP/gRPC address services export to ("" when off): the value of
	// LANES_TRACES.
	GRPCAddr string
	// Token is the telemetry token, for senders in the process (lanes demo's services), and
	// TokenFile the file that holds it when it is kept in the data directory. Both are "" when
	// the receivers need no token.
	Token, TokenFile string
	// ClientTLS is what exporters in this process verify the collector with when it serves TLS:
	// its own certificate, pinned (nil without TLS).
	ClientTLS *tls.Config
}

// GatewayService is the service name of the gateway's spans: the entry point of the traces of
// requests it admits.
const GatewayService = "lanes-gateway"

// TracesKey is the collector and the control plane's tracer provider.
var TracesKey = Key[Traces]{"traces"}

func (c *Config) validateTraces() error {
	t := c.Traces
	for _, a := range []struct{ key, v string }{{"traces.otlp_grpc_addr", t.GRPCAddr}, {"traces.otlp_http_addr", t.HTTPAddr}} {
		if a.v == TracesOff {
			continue
		}
		if err := checkListen(a.v); err != nil {
			return c.fail(a.key, a.v, "%v", err)
		}
	}
	if t.MaxSpans <= 0 {
		return c.fail("traces.max_spans", fmt.Sprint(t.MaxSpans), "want a whole number, 1 or more")
	}
	if t.MaxMiB <= 0 {
		return c.fail("traces.max_mib", fmt.Sprint(t.MaxMiB), "want a whole number of MiB, 1 or more")
	}
	if t.MaxAge <= 0 {
		return c.fail("traces.max_age", t.MaxAge.String(), "want a positive duration such as 1h")
	}
	if t.Sample < 0 || t.Sample > 1 {
		return c.fail("traces.sample", fmt.Sprint(t.Sample), "want a number from 0 to 1")
	}
	switch t.ReceiverAuth {
	case collector.AuthToken, collector.AuthLoopback, collector.AuthOpen:
	default:
		return c.fail("traces.receiver_auth", t.ReceiverAuth, "want %s, %s or %s", collector.AuthToken, collector.AuthLoopback, collector.AuthOpen)
	}
	if t.Token != "" && len(t.Token) < 16 {
		return c.fail("traces.token", "(hidden)", "the telemetry token must be at least 16 characters")
	}
	if t.MaxValueBytes < 64 {
		return c.fail("traces.max_value_bytes", fmt.Sprint(t.MaxValueBytes), "want a whole number of bytes, 64 or more")
	}
	if t.MaxCheckMiB <= 0 {
		return c.fail("traces.max_check_mib", fmt.Sprint(t.MaxCheckMiB), "want a whole number of MiB, 1 or more")
	}
	return nil
}

// collectorComponent runs the trace collector and the control plane's tracer provider.
type collectorComponent struct {
	col   *collector.Collector
	sdk   *sdktrace.TracerProvider
	rt    *Runtime
	fatal fatalWatch
}

func (*collectorComponent) Name() string    { return "traces" }
func (*collectorComponent) Needs() []Dep    { return []Dep{DataDirKey, StoreKey, EngineKey} }
func (*collectorComponent) Provides() []Dep { return []Dep{TracesKey} }

func (*collectorComponent) Validate(cfg *Config) error { return cfg.validateTraces() }

func (c *collectorComponent) Provision(ctx context.Context, rt *Runtime) error {
	c.rt = rt
	t := rt.Config.Traces
	addr := func(a string) string {
		if a == TracesOff {
			return ""
		}
		return a
	}
	out := Traces{Provider: noop.NewTracerProvider()}
	var auth collector.Authenticator
	var tokenNote string
	if t.ReceiverAuth == collector.AuthToken && (t.GRPCAddr != TracesOff || t.HTTPAddr != TracesOff) {
		path, err := filepath.Abs(filepath.Join(Need(rt, DataDirKey), TelemetryTokenFile))
		if err != nil {
			return fmt.Errorf("telemetry token: %w", err)
		}
		if out.Token, tokenNote, err = secretToken(t.Token, rt.Config.sources["traces.token"], path, newTelemetryToken, "telemetry token"); err != nil {
			return err
		}
		if t.Token == "" {
			out.TokenFile = path
		}
		auth = senderAuth(out.Token, admin.NewTokens(Need(rt, StoreKey), "", rt.Log))
	}
	tc, err := rt.Config.ServerTLS(tlsTraces)
	if err != nil {
		return err
	}
	col, err := collector.New(collector.Config{
		TLS:          tc,
		GRPCAddr:     addr(t.GRPCAddr),
		HTTPAddr:     addr(t.HTTPAddr),
		Auth:         t.ReceiverAuth,
		Authenticate: auth,
		Limits: collector.Limits{MaxSpans: t.MaxSpans, MaxBytes: t.MaxMiB << 20, MaxAge: t.MaxAge,
			MaxValueBytes: t.MaxValueBytes, MaxCheckBytes: t.MaxCheckMiB << 20},
		Fleet:      collector.EngineFleet(Need(rt, EngineKey), func(service string) bool { return service == GatewayService }),
		Registerer: rt.Metrics,
		Logger:     rt.Log,
	})
	if err != nil {
		return err
	}
	if err := col.Start(ctx); err != nil {
		return err
	}
	c.col = col
	for name, a := range map[string]net.Addr{"collector OTLP/gRPC": col.GRPCAddr(), "collector OTLP/HTTP": col.HTTPAddr()} {
		if a != nil {
			if err := rt.Listening(ctx, name, a); err != nil {
				return err
			}
		}
	}
	out.Collector = col
	if a := col.GRPCAddr(); a != nil {
		out.GRPCAddr = a.String()
		if tc != nil {
			out.GRPCAddr = listenerURL(a, tc)
			out.ClientTLS = tlsfiles.Pinned(tc)
		}
		note := "trace collector, OTLP/gRPC"
		if h := col.HTTPAddr(); h != nil {
			note += "; OTLP/HTTP on " + h.String()
			if tc != nil {
				note += "; both over TLS"
			}
		}
		switch t.ReceiverAuth {
		case collector.AuthToken:
			note += "; senders need a token: their own registration token, or the " + tokenNote
		case collector.AuthLoopback:
			note += "; from loopback only, no token"
		case collector.AuthOpen:
			note += "; open to anyone, no token"
		}
		rt.Announce(Address{Name: "traces", URL: out.GRPCAddr, Note: note})
		sdk, err := traceexport.NewProvider(ctx, GatewayService, out.GRPCAddr, lanestrace.Sampler(t.Sample), out.Token, out.ClientTLS)
		if err != nil {
			return fmt.Errorf("traces: the control plane's exporter: %w", err)
		}
		c.sdk, out.Provider = sdk, sdk
	}
	Provide(rt, TracesKey, out)
	c.fatal.start(rt, "traces", col.Errors())
	return nil
}

// senderAuth checks the tokens of the senders of spans: the telemetry token may send any span; a
// registration token, what its scope owns. The admin token is not taken: it stays with the
// operator, and services are given the telemetry token or their own.
func senderAuth(telemetry string, tokens *admin.Tokens) collector.Authenticator {
	telemetrySum := sha256.Sum256([]byte(telemetry))
	return func(ctx context.Context, tok string) (collector.Sender, error) {
		sum := sha256.Sum256([]byte(tok))
		if subtle.ConstantTimeCompare(sum[:], telemetrySum[:]) == 1 {
			return collector.Sender{Trusted: true}, nil
		}
		ctx, cancel := context.WithTimeout(ctx, tokenCheckTimeout)
		defer cancel()
		_, t, err := tokens.Check(ctx, tok) // no admin token is given to tokens
		switch {
		case admin.IsUnauthorized(err):
			return collector.Sender{}, fmt.Errorf("%w: %v", collector.ErrUnauthenticated, err)
		case err != nil:
			return collector.Sender{}, err
		}
		return collector.Sender{Baseline: t.Baseline, Lane: t.Lane, ID: t.ID}, nil
	}
}

// tokenCheckTimeout bounds the etcd read of a sender's token.
const tokenCheckTimeout = 5 * time.Second

func (c *collectorComponent) Stop(ctx context.Context) error {
	var err error
	if c.sdk != nil {
		err = c.sdk.Shutdown(ctx) // flushes the gateway's last spans into the collector
	}
	c.fatal.stop()
	if c.col != nil {
		if cerr := c.col.Close(ctx); err == nil {
			err = cerr
		}
	}
	return err
}
