package lanesgrpc

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/lanesdev/lanes/internal/lib/hopspan"
	"github.com/lanesdev/lanes/internal/lib/routedcall"
	"github.com/lanesdev/lanes/lane"
	"github.com/lanesdev/lanes/registry"
)

// UnaryClientInterceptor returns the client interceptor for unary calls. It
// writes the lane of the call's context (lane.FromContext) to the outgoing
// metadata: x-lane and the baggage member "lane", other baggage members
// kept. A baseline call removes stale lane keys (x-lane, alias headers, the
// baggage member) from outgoing metadata that was copied from an incoming
// request. The OpenTelemetry baggage of the call's context gets the same
// lane member (lane.SyncBaggage), so that otelgrpc's client stats handler,
// which writes it after the interceptors, carries the same lane.
//
// For the methods of WithIdempotent it also marks the call so that the
// lanes picker avoids, on a retry, the instance the failed attempt went to.
//
// The lane a canary split chooses at this hop is carried by the picker
// itself (balancer.PickResult.Metadata), since the split happens at the
// pick, after the interceptors. NewClient installs the interceptors.
//
// It bounds each attempt by the response-header timeout
// (WithResponseHeaderTimeout).
func UnaryClientInterceptor(opts ...ClientOption) grpc.UnaryClientInterceptor {
	return newClientInterceptor(clientConfig(opts)).unary
}

// StreamClientInterceptor is UnaryClientInterceptor for streaming calls.
func StreamClientInterceptor(opts ...ClientOption) grpc.StreamClientInterceptor {
	ci := newClientInterceptor(clientConfig(opts))
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, callOpts ...grpc.CallOption) (grpc.ClientStream, error) {
		return streamer(ci.outgoing(ctx, method), desc, cc, method, callOpts...)
	}
}

type clientInterceptor struct {
	prop    lane.Propagator
	idem    methodSet
	timeout time.Duration // response-header timeout; 0: none
}

func newClientInterceptor(c *config) *clientInterceptor {
	idem, _ := parseMethods(c.idempotent) // NewClient reports bad entries; here they never match
	return &clientInterceptor{prop: c.prop, idem: idem, timeout: routedcall.HeaderTimeout(c.timeout)}
}

// errHeaderTimeout is the cause of an attempt cut by the response-header
// timeout.
var errHeaderTimeout = errors.New("lanes: response-header timeout")

func (ci *clientInterceptor) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
	ctx = ci.outgoing(ctx, method)
	if ci.timeout <= 0 {
		return invoker(ctx, method, req, reply, cc, callOpts...)
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= ci.timeout {
		return invoker(ctx, method, req, reply, cc, callOpts...) // the caller's deadline comes first
	}
	for attempt := 0; ; attempt++ {
		tc := startTimed(ctx, ci.timeout)
		err := invoker(tc, method, req, reply, cc, callOpts...)
		cut := tc.end() && err != nil && ctx.Err() == nil
		if !cut {
			return err
		}
		// The instance took too long: it hangs, and is ejected at once
		// (gRPC's Canceled is not reported).
		id := tc.cs.ejectLast()
		if attempt > 0 || !ci.idem.contains(method) {
			return status.Errorf(codes.Unavailable, "lanes: instance %q did not answer %s within %v, the response-header timeout", id, method, ci.timeout)
		}
		ctx = withCallStateOf(ctx, tc.cs) // the retry avoids the instance
	}
}

// timedCall is the context of one attempt under the response-header
// timeout: the caller's context, cancelled when the timeout fires, and
// carrying the call's callState. It is a cancellation rather than a
// deadline, which gRPC would send to the server for the server to set up
// again: the timeout is the caller's own business.
//
// When the caller's context cannot be cancelled (its Done is nil), a
// timedCall is pooled: its channel and timer serve again when the timeout
// did not fire, so that a call allocates nothing for it. It then has an
// AfterFunc method, which context.WithCancel uses: gRPC's own context for
// the call (a child of this one) is cancelled by the timer's function
// rather than by a goroutine that waits on both, which the context package
// would otherwise start for every call. Otherwise it wraps
// context.WithCancelCause.
type timedCall struct {
	context.Context
	cs  *callState
	own callState

	// pooled form
	done  chan struct{}
	timer *time.Timer
	fired atomic.Bool
	mu    sync.Mutex
	after func()      // the function registered by AfterFunc, until it runs or is stopped
	stopF func() bool // c.stopAfter, bound once
	// wrapping form
	cancel context.CancelCauseFunc
	stop   func() bool
}

var timedCalls = sync.Pool{New: func() any {
	c := &timedCall{done: make(chan struct{})}
	c.timer = time.AfterFunc(time.Hour, c.fire)
	c.timer.Stop()
	c.stopF = c.stopAfter
	return c
}}

func (c *timedCall) fire() {
	c.mu.Lock()
	c.fired.Store(true)
	close(c.done)
	f := c.after
	c.after = nil
	c.mu.Unlock()
	if f != nil {
		f()
	}
}

// startTimed starts the timeout d of one attempt made with ctx.
func startTimed(ctx context.Context, d time.Duration) *timedCall {
	var c *timedCall
	if ctx.Done() == nil {
		c = timedCalls.Get().(*timedCall)
		c.Context = ctx
		c.timer.Reset(d)
	} else {
		actx, cancel := context.WithCancelCause(ctx)
		c = &timedCall{Context: actx, cancel: cancel}
		c.stop = time.AfterFunc(d, func() { cancel(errHeaderTimeout) }).Stop
	}
	if c.cs = callStateFrom(ctx); c.cs == nil {
		c.own.last.Store(nil)
		c.own.svc.Store(nil)
		c.own.attempts.Store(0) // a pooled timedCall served other calls before
		c.cs = &c.own
	}
	return c
}

// end stops the timeout and reports whether it had fired.
func (c *timedCall) end() bool {
	if c.cancel != nil {
		fired := !c.stop()
		c.cancel(nil)
		return fired
	}
	if !c.timer.Stop() {
		return true // fired, or firing: the channel is closed, not reused
	}
	c.mu.Lock()
	registered := c.after != nil
	c.mu.Unlock()
	if registered {
		// A context derived from this one is still registered: it may
		// still call stopAfter, which must not reach the next call.
		return false
	}
	c.Context, c.cs = nil, nil
	timedCalls.Put(c)
	return false
}

// AfterFunc implements the interface that context.AfterFunc and
// context.WithCancel look for: f runs when the timeout fires. The pooled
// form keeps one registration (gRPC's context for the call) without
// allocating; further ones, and the wrapping form, go through
// context.AfterFunc.
func (c *timedCall) AfterFunc(f func()) func() bool {
	if c.cancel != nil {
		return context.AfterFunc(c.Context, f)
	}
	c.mu.Lock()
	switch {
	case c.fired.Load():
		c.mu.Unlock()
		go f()
		return func() bool { return false }
	case c.after != nil:
		c.mu.Unlock()
		return context.AfterFunc(doneOf{c}, f)
	}
	c.after = f
	c.mu.Unlock()
	return c.stopF
}

// stopAfter is the stop function of the registration of AfterFunc.
func (c *timedCall) stopAfter() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	stopped := c.after != nil
	c.after = nil
	return stopped
}

// doneOf is a timedCall without its AfterFunc method, for the registrations
// after the first one.
type doneOf struct{ c *timedCall }

func (d doneOf) Deadline() (time.Time, bool) { return d.c.Deadline() }
func (d doneOf) Done() <-chan struct{}       { return d.c.Done() }
func (d doneOf) Err() error                  { return d.c.Err() }
func (d doneOf) Value(key any) any           { return d.c.Value(key) }

func (c *timedCall) Done() <-chan struct{} {
	if c.cancel != nil {
		return c.Context.Done()
	}
	return c.done
}

func (c *timedCall) Err() error {
	if c.cancel != nil {
		return c.Context.Err()
	}
	if c.fired.Load() {
		return context.Canceled
	}
	return nil // the caller's context cannot be cancelled
}

func (c *timedCall) Value(key any) any {
	if _, ok := key.(callKey); ok {
		return c.cs
	}
	return c.Context.Value(key)
}

// outgoing returns the context of the call with the lane in its metadata.
func (ci *clientInterceptor) outgoing(ctx context.Context, method string) context.Context {
	v := lane.Carry(ctx) // the lane, the key and their headers, read once
	l := v.Lane()
	md, ok := metadata.FromOutgoingContext(ctx) // a copy; no allocation when there is none
	if !ok && l != "" {
		if e := v.Encoded(); e != nil {
			// The common case: the metadata of the lane alone, built once
			// per lane (gRPC does not modify the metadata of a context).
			return ci.finish(metadata.NewOutgoingContext(ctx, metadata.MD(e.Metadata)), l, method)
		}
	}
	if l != "" || ok && ci.hasLaneKeys(md) || v.Key() != "" {
		if !ok {
			md = metadata.MD{}
		}
		ci.prop.InjectCarried(v, l, lane.Metadata(md)) // an invalid lane is written as the baseline; a baseline call carries the request key
		ctx = metadata.NewOutgoingContext(ctx, md)
	}
	return ci.finish(ctx, l, method)
}

// finish returns the call's context once its metadata carries lane l.
func (ci *clientInterceptor) finish(ctx context.Context, l, method string) context.Context {
	// otelgrpc's client stats handler, which runs after the interceptors,
	// writes the baggage of the context whole: it must carry the same lane.
	ctx = lane.SyncBaggage(ctx, l)
	if ci.idem.contains(method) {
		ctx = withCallState(ctx)
	}
	return ctx
}

// hasLaneKeys reports whether md may hold a lane that a baseline call must
// remove. It may err towards yes.
func (ci *clientInterceptor) hasLaneKeys(md metadata.MD) bool {
	if len(md[lane.Header]) > 0 {
		return true
	}
	for _, a := range ci.prop.Aliases {
		if len(md[strings.ToLower(a)]) > 0 {
			return true
		}
	}
	for _, v := range md[lane.BaggageHeader] {
		if strings.Contains(v, lane.BaggageKey) {
			return true
		}
	}
	return false
}

// UnaryServerInterceptor returns the server interceptor for unary calls. It
// reads the lane of the request from the incoming metadata (x-lane, then the
// baggage member "lane", then the propagator's aliases) into the context of
// the handler, where lane.FromContext finds it and the lanes client
// interceptors carry it on. A request without a lane, or with an invalid one,
// is a baseline request: the context then carries the baseline explicitly.
// Invalid lanes are counted by WithInvalidLaneHandler and logged.
//
// With WithGuard, it then refuses the requests that the guard does not
// admit.
func UnaryServerInterceptor(opts ...ServerOption) grpc.UnaryServerInterceptor {
	return newServerInterceptor(serverConfig(opts)).unary
}

// StreamServerInterceptor is UnaryServerInterceptor for streaming calls.
func StreamServerInterceptor(opts ...ServerOption) grpc.StreamServerInterceptor {
	return newServerInterceptor(serverConfig(opts)).stream
}

// ServerOptions returns the server interceptors as options for
// grpc.NewServer, chained after any interceptor given before them, for a
// server that NewServer does not make; give its guard to Serve too:
//
//	guard := lanesgrpc.NewGuard(engine)
//	srv := grpc.NewServer(lanesgrpc.ServerOptions(lanesgrpc.WithGuard(guard))...)
//	err := lanesgrpc.Serve(ctx, srv, lis, reg, inst, lanesgrpc.WithGuard(guard))
func ServerOptions(opts ...ServerOption) []grpc.ServerOption {
	c := serverConfig(opts)
	si := newServerInterceptor(c)
	return append(c.statsHandler(), grpc.ChainUnaryInterceptor(si.unary), grpc.ChainStreamInterceptor(si.stream))
}

// NewServer returns a gRPC server with the lanes server interceptors
// (ServerOptions(opts...)), after the options of WithServerOptions. Serve
// finds the server's WithGuard guard and tells it the instance, so that the
// guard is given once:
//
//	srv := lanesgrpc.NewServer(lanesgrpc.WithGuard(lanesgrpc.NewGuard(engine)))
//	pb.RegisterOrdersServer(srv, &orders{})
//	err := lanesgrpc.Serve(ctx, srv, lis, reg, registry.Instance{Service: "orders"})
//
// A server that is never given to Serve keeps its guard reachable until the
// process ends.
func NewServer(opts ...ServerOption) *grpc.Server {
	c := serverConfig(opts)
	si := newServerInterceptor(c)
	sopts := append(slices.Clip(c.srvOpts), c.statsHandler()...)
	sopts = append(sopts, grpc.ChainUnaryInterceptor(si.unary), grpc.ChainStreamInterceptor(si.stream))
	srv := grpc.NewServer(sopts...)
	servers.Store(srv, si)
	return srv
}

// statsHandler returns otelgrpc's server stats handler when calls are traced.
func (c *config) statsHandler() []grpc.ServerOption {
	tp := c.tracerProvider()
	if tp == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(propagation.TraceContext{})))}
}

// servers holds the interceptors of the servers that NewServer made, until
// Serve takes them and settles their guard.
var servers sync.Map // *grpc.Server -> *serverInterceptor

type serverInterceptor struct {
	prop          lane.Propagator
	guard         atomic.Pointer[Guard] // nil: none
	noGuard       bool                  // WithoutGuard
	exemptMethods []string              // besides DefaultExempt
	log           *slog.Logger
	onInvalid     func(context.Context, string, *lane.NameError)

	invalid atomic.Uint64 // invalid lanes since the last log line
	lastLog atomic.Int64  // unix ns of the last log line
}

func newServerInterceptor(c *config) *serverInterceptor {
	si := &serverInterceptor{prop: c.prop, noGuard: c.noGuard, exemptMethods: c.exempt, log: c.log, onInvalid: c.onInvalid}
	si.guard.Store(c.guard)
	return si
}

func (si *serverInterceptor) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, err := si.incoming(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (si *serverInterceptor) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, err := si.incoming(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return handler(srv, &serverStream{ServerStream: ss, ctx: ctx})
}

// incoming returns the handler's context, or the guard's refusal.
func (si *serverInterceptor) incoming(ctx context.Context, method string) (context.Context, error) {
	c := carriers.Get().(*incomingCarrier) // one carrier for every read
	*c = incomingCarrier{ctx: ctx}
	defer func() { *c = incomingCarrier{}; carriers.Put(c) }()
	name, _, err := si.prop.Extract(c)
	if err != nil {
		si.invalidLane(ctx, method, err)
	}
	ctx = si.prop.EntryContext(ctx, name, c) // and the OpenTelemetry baggage that otelgrpc's stats handler read
	if c.Values(lane.BaggageHeader) != nil && !lane.BaggageCarries(c, name) {
		// An interceptor or handler after this one that reads the baggage
		// again from the metadata must read the lane decided here.
		md, _ := metadata.FromIncomingContext(ctx) // a copy
		if md == nil {
			md = metadata.MD{}
		}
		si.prop.InjectLane(name, lane.Metadata(md))
		ctx = metadata.NewIncomingContext(ctx, md)
	}
	var (
		serving  string
		inst     *registry.Instance
		admitted = true
		exempt   bool // admitted only because the method is exempt
	)
	if g := si.guard.Load(); g != nil {
		serving, inst, admitted = g.Admit(name, func() bool { exempt = si.exempt(method); return exempt })
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		hopspan.RecordServer(span, name, serving, admitted, exempt)
	}
	if !admitted {
		return nil, refusal(ctx, serving, inst)
	}
	return ctx, nil
}

// logEvery is the least time between two log lines about invalid lanes.
const logEvery = 10 * time.Second

func (si *serverInterceptor) invalidLane(ctx context.Context, method string, err error) {
	var ne *lane.NameError
	errors.As(err, &ne)
	if si.onInvalid != nil {
		si.onInvalid(ctx, method, ne)
	}
	si.invalid.Add(1)
	now := time.Now().UnixNano()
	last := si.lastLog.Load()
	if now-last >= int64(logEvery) && si.lastLog.CompareAndSwap(last, now) {
		si.log.Warn("lanes: invalid lane ignored; request served as baseline",
			"method", method, "err", err, "invalid_since_last_log", si.invalid.Swap(0))
	}
}

// incomingCarrier is a read-only lane.Carrier over the incoming metadata of
// a server call. It reads the keys the propagator asks for, one by one,
// instead of copying the whole metadata: a request without a lane costs no
// allocation. The baggage values, which several reads look at, are copied
// once. Carriers are pooled: nothing holds one after the call's incoming
// returns (what it returned, the metadata's strings, outlives it).
type incomingCarrier struct {
	ctx     context.Context
	bag     []string
	bagRead bool
}

var carriers = sync.Pool{New: func() any { return new(incomingCarrier) }}

func (c *incomingCarrier) Get(key string) string {
	if v := c.Values(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c *incomingCarrier) Values(key string) []string {
	if key != lane.BaggageHeader {
		return metadata.ValueFromIncomingContext(c.ctx, key)
	}
	if !c.bagRead {
		c.bag, c.bagRead = metadata.ValueFromIncomingContext(c.ctx, key), true
	}
	return c.bag
}

func (*incomingCarrier) Set(string, string) {}
func (*incomingCarrier) Del(string)         {}

// serverStream gives a stream handler the context with the lane.
type serverStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *serverStream) Context() context.Context { return s.ctx }
