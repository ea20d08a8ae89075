// Package collector is the trace collector of `lanes up`: an OTLP receiver over gRPC and HTTP, a
// bounded in-memory store of recent traces, and the lane integrity checks that run on spans as
// they arrive (breach, needless fallback, lane lost, trace broken). `lanes trace`, the admin API
// and the dashboard read it.
package collector

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/lanesdev/lanes/adminapi"
)

// Config configures a Collector.
type Config struct {
	// GRPCAddr and HTTPAddr are the OTLP listen addresses ("" turns a receiver off; port 0 takes
	// a free port). `lanes up` uses DefaultGRPCAddr and DefaultHTTPAddr.
	GRPCAddr string
	HTTPAddr string
	Limits   Limits
	// MaxFindings bounds the findings kept; 0 is 10,000.
	MaxFindings int
	// Fleet answers the integrity checks' questions; nil turns off the checks that need it.
	Fleet Fleet
	// Registerer takes lanes_integrity_findings_total and the store's gauges; nil registers
	// nothing.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// TLS, when set, has both receivers serve TLS with its certificates
	// (OTLP/gRPC over HTTP/2, OTLP/HTTP over HTTP/2 or HTTP/1.1).
	TLS *tls.Config
}

// The OTLP ports, as OpenTelemetry SDKs expect them by default.
const (
	DefaultGRPCAddr = "127.0.0.1:4317"
	DefaultHTTPAddr = "127.0.0.1:4318"
)

// Validate checks cfg without starting anything.
func (cfg Config) Validate() error {
	for _, a := range []struct{ name, addr string }{{"grpc address", cfg.GRPCAddr}, {"http address", cfg.HTTPAddr}} {
		if a.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			return fmt.Errorf("collector: %s %q: want host:port", a.name, a.addr)
		}
	}
	if cfg.Limits.MaxSpans < 0 || cfg.Limits.MaxBytes < 0 || cfg.Limits.MaxAge < 0 {
		return fmt.Errorf("collector: limits must not be negative (spans %d, bytes %d, age %s)", cfg.Limits.MaxSpans, cfg.Limits.MaxBytes, cfg.Limits.MaxAge)
	}
	if cfg.MaxFindings < 0 {
		return fmt.Errorf("collector: max findings %d must not be negative", cfg.MaxFindings)
	}
	return nil
}

// Collector receives spans, stores them and checks them.
type Collector struct {
	store   *Store
	checker *checker
	log     *slog.Logger
	cfg     Config

	grpcSrv  *grpc.Server
	httpSrv  *http.Server
	grpcAddr net.Addr
	httpAddr net.Addr
	wg       sync.WaitGroup
	errs     chan error
}

// New returns a collector that has not started listening: Ingest works at once; Start opens the
// receivers.
func New(cfg Config) (*Collector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxFindings == 0 {
		cfg.MaxFindings = 10_000
	}
	c := &Collector{store: NewStore(cfg.Limits), log: cfg.Logger.With("component", "collector"), cfg: cfg, errs: make(chan error, 2)}
	counter := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lanes_integrity_findings_total",
		Help: "Lane integrity findings on collected spans, by kind (breach, needless_fallback, lane_lost, trace_broken) and service.",
	}, []string{"kind", "service"})
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(counter); err != nil {
			return nil, fmt.Errorf("collector: registering metrics: %w", err)
		}
		stats := c.store.Stats
		for _, col := range []prometheus.Collector{
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lanes_traces_stored_spans", Help: "Spans in the trace store."},
				func() float64 { return float64(stats().Spans) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lanes_traces_stored_bytes", Help: "Bytes charged for the spans in the trace store."},
				func() float64 { return float64(stats().Bytes) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lanes_traces_dropped_spans_total", Help: "Spans the trace store dropped to stay within its limits."},
				func() float64 { return float64(stats().Dropped.Spans) }),
		} {
			if err := cfg.Registerer.Register(col); err != nil {
				return nil, fmt.Errorf("collector: registering metrics: %w", err)
			}
		}
	}
	c.checker = newChecker(c.store, cfg.Fleet, counter, cfg.MaxFindings)
	return c, nil
}

// Start opens the receivers. A listener that cannot be opened fails Start; an error of a running
// server is reported on Errors.
func (c *Collector) Start(ctx context.Context) error {
	var lc net.ListenConfig
	var lisGRPC, lisHTTP net.Listener
	var err error
	if c.cfg.GRPCAddr != "" {
		if lisGRPC, err = lc.Listen(ctx, "tcp", c.cfg.GRPCAddr); err != nil {
			return fmt.Errorf("collector: OTLP/gRPC on %s: %w", c.cfg.GRPCAddr, err)
		}
	}
	if c.cfg.HTTPAddr != "" {
		if lisHTTP, err = lc.Listen(ctx, "tcp", c.cfg.HTTPAddr); err != nil {
			if lisGRPC != nil {
				lisGRPC.Close()
			}
			return fmt.Errorf("collector: OTLP/HTTP on %s: %w", c.cfg.HTTPAddr, err)
		}
	}
	if lisGRPC != nil {
		var creds []grpc.ServerOption
		if c.cfg.TLS != nil {
			creds = append(creds, grpc.Creds(credentials.NewTLS(c.cfg.TLS)))
		}
		c.grpcSrv = grpc.NewServer(append(creds,
			grpc.MaxRecvMsgSize(maxRequestBytes),
			grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		)...)
		coltracepb.RegisterTraceServiceServer(c.grpcSrv, grpcReceiver{c: c})
		c.grpcAddr = lisGRPC.Addr()
		c.serve(func() error { return c.grpcSrv.Serve(lisGRPC) })
	}
	if lisHTTP != nil {
		c.httpSrv = &http.Server{Handler: c.httpReceiver(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
		c.httpAddr = lisHTTP.Addr()
		c.httpSrv.TLSConfig = c.cfg.TLS
		c.serve(func() error {
			if c.cfg.TLS != nil {
				return c.httpSrv.ServeTLS(lisHTTP, "", "")
			}
			return c.httpSrv.Serve(lisHTTP)
		})
	}
	c.log.Info("trace collector listening", "otlp_grpc", addrString(c.grpcAddr), "otlp_http", addrString(c.httpAddr),
		"max_spans", c.store.limits.MaxSpans, "max_bytes", c.store.limits.MaxBytes, "max_age", c.store.limits.MaxAge)
	return nil
}

func (c *Collector) serve(run func() error) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if err := run(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
			select {
			case c.errs <- err:
			default:
			}
		}
	}()
}

// Errors reports the failure of a running receiver.
func (c *Collector) Errors() <-chan error { return c.errs }

// Close stops the receivers, waiting for requests in flight until ctx ends.
func (c *Collector) Close(ctx context.Context) error {
	var err error
	if c.httpSrv != nil {
		err = c.httpSrv.Shutdown(ctx)
	}
	if c.grpcSrv != nil {
		done := make(chan struct{})
		go func() { c.grpcSrv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			c.grpcSrv.Stop()
			<-done
		}
	}
	c.wg.Wait()
	return err
}

// GRPCAddr and HTTPAddr return the receivers' addresses once started (nil when off).
func (c *Collector) GRPCAddr() net.Addr { return c.grpcAddr }
func (c *Collector) HTTPAddr() net.Addr { return c.httpAddr }

// Ingest stores and checks the spans of one OTLP request, and returns how many it rejected.
func (c *Collector) Ingest(req *coltracepb.ExportTraceServiceRequest) (rejected int64) {
	var total int64
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			total += int64(len(ss.GetSpans()))
		}
	}
	spans := fromOTLP(req.GetResourceSpans())
	c.checker.check(c.store.add(spans))
	return total - int64(len(spans))
}

// Traces returns the newest stored traces that match f, newest first, each with its number of
// findings, and the store's statistics.
func (c *Collector) Traces(f Filter) adminapi.TraceList {
	list := adminapi.TraceList{Traces: c.store.Recent(f), Stats: c.Stats()}
	counts := map[string]int{}
	for _, fd := range c.checker.list(time.Time{}, "") {
		counts[fd.TraceID]++
		if fd.ParentTraceID != "" && fd.ParentTraceID != fd.TraceID {
			counts[fd.ParentTraceID]++
		}
	}
	for i := range list.Traces {
		list.Traces[i].Findings = counts[list.Traces[i].TraceID]
	}
	if list.Traces == nil {
		list.Traces = []adminapi.TraceSummary{}
	}
	return list
}

// Trace returns trace id as hops, with its findings; false when the store does not have it.
func (c *Collector) Trace(id string) (adminapi.Trace, bool) {
	spans := c.store.Trace(id)
	if spans == nil {
		return adminapi.Trace{}, false
	}
	findings := c.checker.list(time.Time{}, id)
	if findings == nil {
		findings = []Finding{}
	}
	return adminapi.Trace{TraceID: id, Hops: Hops(spans, findings), Findings: findings}, true
}

// Stats describe the store.
func (c *Collector) Stats() adminapi.TraceStats {
	st := c.store.Stats()
	out := adminapi.TraceStats{Traces: st.Traces, Spans: st.Spans, Bytes: st.Bytes,
		MaxSpans: st.Limits.MaxSpans, MaxBytes: st.Limits.MaxBytes, MaxAge: adminapi.Duration(st.Limits.MaxAge)}
	out.Dropped.Traces, out.Dropped.Spans = st.Dropped.Traces, st.Dropped.Spans
	return out
}

// Store returns the span store.
func (c *Collector) Store() *Store { return c.store }

// Findings returns the findings that arrived at since or later (every one kept, for the zero
// time), newest first; with traceID, only those on that trace.
func (c *Collector) Findings(since time.Time, traceID string) []Finding {
	return c.checker.list(since, traceID)
}

func addrString(a net.Addr) string {
	if a == nil {
		return "off"
	}
	return a.String()
}
