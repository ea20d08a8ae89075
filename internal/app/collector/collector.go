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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/lanesdev/lanes/adminapi"
	"github.com/lanesdev/lanes/internal/lib/accept"
	"github.com/lanesdev/lanes/lanesmetrics"
)

// Config configures a Collector.
type Config struct {
	// GRPCAddr and HTTPAddr are the OTLP listen addresses ("" turns a receiver off; port 0 takes
	// a free port). `lanes up` uses DefaultGRPCAddr and DefaultHTTPAddr.
	GRPCAddr string
	HTTPAddr string
	// Auth says who may send spans: AuthToken ("" is AuthToken), AuthLoopback or AuthOpen.
	Auth string
	// Authenticate checks the tokens of requests where Auth is AuthToken; without it, such a
	// collector refuses every request.
	Authenticate Authenticator
	Limits       Limits
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
	switch cfg.Auth {
	case "", AuthToken, AuthLoopback, AuthOpen:
	default:
		return fmt.Errorf("collector: receiver auth %q: want %s, %s or %s", cfg.Auth, AuthToken, AuthLoopback, AuthOpen)
	}
	l := cfg.Limits
	if l.MaxSpans < 0 || l.MaxBytes < 0 || l.MaxAge < 0 || l.MaxValueBytes < 0 || l.MaxCheckBytes < 0 {
		return fmt.Errorf("collector: limits must not be negative (spans %d, bytes %d, age %s, value bytes %d, check bytes %d)",
			l.MaxSpans, l.MaxBytes, l.MaxAge, l.MaxValueBytes, l.MaxCheckBytes)
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

	truncated atomic.Int64 // strings cut to Limits.MaxValueBytes
	refused   atomic.Int64 // spans refused for their sender's scope
	authFails atomic.Int64 // requests refused for their credential
	lastLog   atomic.Int64 // unix nanoseconds of the last log line about drops
	logged    atomic.Pointer[dropCounts]

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
	if cfg.Auth == "" {
		cfg.Auth = AuthToken
	}
	cfg.Limits = cfg.Limits.withDefaults()
	c := &Collector{store: NewStore(cfg.Limits), log: cfg.Logger.With("component", "collector"), cfg: cfg, errs: make(chan error, 2)}
	counter := &boundedCounter{vec: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lanes_integrity_findings_total",
		Help: fmt.Sprintf("Lane integrity findings on collected spans, by kind (breach, needless_fallback, lane_lost, trace_broken) and service. Services past the first %d are counted as \"other\".", lanesmetrics.MaxServices),
	}, []string{"kind", "service"}), services: lanesmetrics.NewBound(lanesmetrics.MaxServices)}
	c.checker = newChecker(c.store, cfg.Fleet, counter, cfg.MaxFindings, cfg.Limits.MaxCheckBytes)
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(counter.vec); err != nil {
			return nil, fmt.Errorf("collector: registering metrics: %w", err)
		}
		stats := c.Stats
		for _, col := range []prometheus.Collector{
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lanes_traces_stored_spans", Help: "Spans in the trace store."},
				func() float64 { return float64(stats().Spans) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lanes_traces_stored_bytes", Help: "Bytes charged for the spans in the trace store."},
				func() float64 { return float64(stats().Bytes) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lanes_traces_dropped_spans_total", Help: "Spans the trace store dropped to stay within its limits."},
				func() float64 { return float64(stats().Dropped.Spans) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lanes_traces_truncated_values_total", Help: "Span names and attribute values cut to traces.max_value_bytes as they arrived."},
				func() float64 { return float64(c.truncated.Load()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lanes_traces_refused_spans_total", Help: "Spans refused because their sender's token may not send them."},
				func() float64 { return float64(c.refused.Load()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lanes_traces_auth_failures_total", Help: "OTLP requests refused for a missing, unknown or wrong token, or a peer that is not loopback."},
				func() float64 { return float64(c.authFails.Load()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lanes_integrity_bytes", Help: "Bytes charged for what the integrity checks keep: findings and per-service state."},
				func() float64 { st := stats(); return float64(st.Checks.FindingBytes + st.Checks.StateBytes) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lanes_integrity_dropped_findings_total", Help: "Findings dropped, the oldest first, to stay within their bounds."},
				func() float64 { return float64(stats().Dropped.Findings) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "lanes_integrity_dropped_state_total", Help: "Spans the trace_broken check forgot, the oldest first, to stay within its bound."},
				func() float64 { return float64(stats().Dropped.CheckState) }),
		} {
			if err := cfg.Registerer.Register(col); err != nil {
				return nil, fmt.Errorf("collector: registering metrics: %w", err)
			}
		}
	}
	return c, nil
}

// boundedCounter is lanes_integrity_findings_total, its service label bounded by lanesmetrics'
// rule. A nil one counts nothing.
type boundedCounter struct {
	vec      *prometheus.CounterVec
	services *lanesmetrics.Bound
}

func (b *boundedCounter) inc(kind, service string) {
	if b == nil {
		return
	}
	b.vec.WithLabelValues(kind, b.services.Label(service)).Inc()
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
	// Each receiver accepts through internal/lib/accept: a temporary
	// accept error is waited out (grpc-go's and net/http's Serve would
	// wait out most too, not ENOBUFS), and the connections are capped.
	// Over the cap, an OTLP/HTTP client is answered 503, which OTLP
	// exporters retry; a gRPC one is closed, which they see as
	// UNAVAILABLE and retry too.
	if lisGRPC != nil {
		lisGRPC = accept.Wrap(lisGRPC, accept.Options{Name: "collector OTLP/gRPC", MaxConns: ReceiverMaxConns(), Logger: c.log})
	}
	if lisHTTP != nil {
		lisHTTP = accept.Wrap(lisHTTP, accept.Options{Name: "collector OTLP/HTTP", MaxConns: ReceiverMaxConns(), Logger: c.log,
			Shed: func(conn net.Conn) { conn.Write(shedAnswer) }})
	}
	if lisGRPC != nil {
		var creds []grpc.ServerOption
		if c.cfg.TLS != nil {
			creds = append(creds, grpc.Creds(credentials.NewTLS(c.cfg.TLS)))
		}
		c.grpcSrv = grpc.NewServer(append(creds,
			grpc.MaxRecvMsgSize(maxRequestBytes),
			// As the OTLP/HTTP receiver's ReadHeaderTimeout: a connection
			// that does not finish the HTTP/2 handshake holds its place
			// no longer (grpc-go's default is 120s).
			grpc.ConnectionTimeout(10*time.Second),
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

// ReceiverMaxConns caps the connections open at once on each receiver: a
// sixteenth of the process's open-file limit, at most 1,000.
func ReceiverMaxConns() int { return accept.Share(16, 1000) }

var shedAnswer = accept.Answer("", "lanes: the trace collector is at its connection limit; try again\n")

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

// Ingest stores and checks the spans of one OTLP request from a trusted sender, and returns how
// many it rejected.
func (c *Collector) Ingest(req *coltracepb.ExportTraceServiceRequest) (rejected int64) {
	n, _ := c.ingest(req, Sender{Trusted: true})
	return n
}

// ingest stores and checks the spans of one OTLP request from sender, and returns how many it
// rejected, and why.
func (c *Collector) ingest(req *coltracepb.ExportTraceServiceRequest, sender Sender) (rejected int64, why string) {
	var total int64
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			total += int64(len(ss.GetSpans()))
		}
	}
	conv := converter{max: c.cfg.Limits.MaxValueBytes}
	spans := conv.fromOTLP(req.GetResourceSpans())
	c.truncated.Add(conv.truncated)
	invalid := total - int64(len(spans))
	var refused int64
	var refusal error
	scope := sender.scope()
	kept := spans[:0]
	for _, sp := range spans {
		if err := c.allows(sender, sp); err != nil {
			refused++
			if refusal == nil {
				refusal = fmt.Errorf("span %q of %s: %w", sp.Name, sp.Service, err)
			}
			continue
		}
		sp.sender = scope
		kept = append(kept, sp)
	}
	c.refused.Add(refused)
	c.checker.check(c.store.add(kept))
	c.logDrops()
	var whys []string
	if invalid > 0 {
		whys = append(whys, fmt.Sprintf("%d spans without a valid trace or span id", invalid))
	}
	if refused > 0 {
		whys = append(whys, fmt.Sprintf("%d spans refused (%v)", refused, refusal))
	}
	return invalid + refused, strings.Join(whys, "; ")
}

// dropCounts are what the collector has let go, for its log lines.
type dropCounts struct{ spans, findings, state, truncated, refused int64 }

// dropLogEvery is how often at most the collector logs that it dropped something.
const dropLogEvery = time.Minute

// logDrops logs what the collector let go since its last such line, at most once per
// dropLogEvery.
func (c *Collector) logDrops() {
	now := time.Now().UnixNano()
	last := c.lastLog.Load()
	if now-last < int64(dropLogEvery) || !c.lastLog.CompareAndSwap(last, now) {
		return
	}
	st := c.Stats()
	cur := &dropCounts{st.Dropped.Spans, st.Dropped.Findings, st.Dropped.CheckState, st.Truncated, st.Refused}
	prev := c.logged.Swap(cur)
	if prev == nil {
		prev = &dropCounts{}
	}
	if *cur == *prev {
		return
	}
	c.log.Warn("trace collector dropped data to stay within its bounds",
		"spans_dropped", cur.spans-prev.spans, "findings_dropped", cur.findings-prev.findings,
		"check_state_dropped", cur.state-prev.state, "values_truncated", cur.truncated-prev.truncated,
		"spans_refused", cur.refused-prev.refused, "stored_bytes", st.Bytes, "max_bytes", st.MaxBytes,
		"check_bytes", st.Checks.FindingBytes+st.Checks.StateBytes, "max_check_bytes", st.Checks.MaxBytes)
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

// Stats describe the store and the integrity checks: their size, their bounds and what they let
// go.
func (c *Collector) Stats() adminapi.TraceStats {
	st := c.store.Stats()
	out := adminapi.TraceStats{Traces: st.Traces, Spans: st.Spans, Bytes: st.Bytes,
		MaxSpans: st.Limits.MaxSpans, MaxBytes: st.Limits.MaxBytes, MaxAge: adminapi.Duration(st.Limits.MaxAge),
		MaxValueBytes: c.cfg.Limits.MaxValueBytes, Truncated: c.truncated.Load(), Refused: c.refused.Load()}
	out.Dropped.Traces, out.Dropped.Spans = st.Dropped.Traces, st.Dropped.Spans
	findings, fb, sb, services, dropped := c.checker.stats()
	out.Checks = adminapi.CheckStats{Findings: findings, FindingBytes: fb, StateBytes: sb, Services: services, MaxBytes: c.cfg.Limits.MaxCheckBytes}
	out.Dropped.Findings, out.Dropped.CheckState = dropped.Findings, dropped.State
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
