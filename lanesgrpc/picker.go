package lanesgrpc

import (
	"context"
	"fmt"
	"sync/atomic"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/lanesdev/lanes/internal/lib/hopspan"
	"github.com/lanesdev/lanes/internal/lib/routedcall"
	"github.com/lanesdev/lanes/lanesmetrics"
	"github.com/lanesdev/lanes/routing"
)

// maxPicks bounds how many times one call asks the engine for an instance
// before it gives up on finding a ready connection in this picker.
const maxPicks = 8

// conn is the state of the connection to one address, in one picker.
type conn struct {
	state  connectivity.State
	picker balancer.Picker // the pick_first child's picker
}

// picker is an immutable snapshot of the connections, rebuilt whenever one
// of them changes state or the resolver sends new instances. Routing
// decisions are not in it: each Pick asks the engine, whose own snapshot
// follows the registry and the policy.
type picker struct {
	eng   *routing.Engine // its outlier policy; nil: the default
	svc   *routing.Service
	zone  string                             // the caller's zone
	host  string                             // the caller's host
	conns map[string]conn                    // by instance address
	dones map[string]func(balancer.DoneInfo) // by instance id
	b     *lanesBalancer
	// metrics counts the picks (WithMetrics); nil counts nothing.
	metrics *lanesmetrics.Requests
}

// Pick asks the engine for an instance for the call and returns the ready
// connection to its address.
//
// When the chosen instance has no ready connection, Pick asks again, up to
// maxPicks times in all. An instance whose connection is in
// TRANSIENT_FAILURE (refused, reset) is marked failing at once
// (routedcall.MarkFailing: ejected), so that the next ask, within the same
// Pick, goes to the next eligible instance or along the lane's fallback
// chain; a half-open probe that cannot be sent is reported failed too. When no ready connection was
// found, Pick returns ErrNoSubConnAvailable if one of the chosen instances
// is still connecting (or has no connection yet: the resolver is then asked
// for a fresh state), and otherwise an error naming the service, the lane
// and the last connection error, which gRPC turns into Unavailable (or
// waits on, for a wait-for-ready call).
//
// A routing error (no_instance, lane_unavailable) ends the call with
// Unavailable and the engine's message, prefixed with "lanes: ".
//
// On a retry of an idempotent call, Pick avoids the instance of the
// previous attempt (routedcall.Repick): it asks for another instance of the
// lane, or, when the lane has no other eligible instance, for the next lane
// of its chain (the fallback lanes, then the baseline; none past a strict
// lane). Only when no other instance may serve does the retry go to the
// same instance again.
//
// Pick does not allocate, except on the error paths and the first time a
// canary lane is carried.
func (p *picker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	if p.svc == nil {
		return balancer.PickResult{}, errNoService
	}
	req := routing.RequestFromContext(info.Ctx, p.zone, p.host)
	cs := callStateFrom(info.Ctx)
	avoid := cs.lastID()

	var (
		pending bool
		connErr error
	)
	for range maxPicks {
		res, err := p.pick(req, avoid)
		if err != nil {
			p.record(info.Ctx, req, res, err, nil)
			return balancer.PickResult{}, status.Error(codes.Unavailable, "lanes: "+err.Error())
		}
		c, ok := p.conns[res.Instance.Addr]
		if !ok {
			// The engine knows an instance the resolver has not listed yet.
			pending = true
			p.b.requestResolve()
			if res.Probe() {
				res.Report(false)
			}
			continue
		}
		switch c.state {
		case connectivity.Ready:
			return p.result(info, c, res, req, cs)
		case connectivity.TransientFailure:
			if _, err := c.picker.Pick(info); err != nil {
				connErr = err
			}
			routedcall.MarkFailing(res)
		default: // Connecting or Idle
			pending = true
			if res.Probe() {
				res.Report(false)
			}
		}
	}
	if pending {
		return balancer.PickResult{}, balancer.ErrNoSubConnAvailable
	}
	return balancer.PickResult{}, &unreachableError{service: p.svc.Name(), lane: req.Lane, err: connErr}
}

// pick asks the engine for the instance of an attempt. The retry of a call
// (avoid: the instance of its failed attempt) asks for another one
// (routedcall.Repick), and has the avoided instance again (or the routing
// error) only when no other instance may serve.
func (p *picker) pick(req routing.Request, avoid string) (routing.Result, error) {
	if avoid != "" {
		if res, err := routedcall.Repick(p.svc, req, []string{avoid}); err == nil {
			return res, nil
		}
	}
	return p.svc.Pick(req)
}

// result completes the pick of a ready connection.
func (p *picker) result(info balancer.PickInfo, c conn, res routing.Result, req routing.Request, cs *callState) (balancer.PickResult, error) {
	pr, err := c.picker.Pick(info)
	if err != nil {
		// The connection left READY after this picker was built; a new
		// picker is on its way.
		return balancer.PickResult{}, balancer.ErrNoSubConnAvailable
	}
	pr.Done = p.dones[res.Instance.ID]
	if req.Lane == "" && res.RequestLane != "" {
		// A canary split chose the lane of this baseline request: it must
		// travel downstream, and the metadata of the call was written
		// before the pick. See docs/grpc.md.
		pr.Metadata = p.b.md.get(res.RequestLane)
	}
	if cs != nil {
		cs.last.Store(&res.Instance.ID)
		cs.svc.Store(p.svc)
	}
	p.record(info.Ctx, req, res, nil, cs)
	return pr, nil
}

// record counts the pick res (or its error) in the metrics and writes it on otelgrpc's client
// span of the attempt, with one description of the decision for both. An attempt after the
// first of a call (cs) is a retry.
func (p *picker) record(ctx context.Context, req routing.Request, res routing.Result, err error, cs *callState) {
	span := trace.SpanFromContext(ctx)
	traced := span.IsRecording()
	if !traced && p.metrics == nil {
		return
	}
	retries := 0
	if traced && cs != nil {
		retries = int(cs.attempts.Add(1)) - 1
	}
	d := hopspan.DecisionOf(p.eng, p.svc, req.Lane, res, err, retries)
	p.metrics.Observe(d.Service, d.Requested, d.Served, d.Reason)
	if traced {
		hopspan.RecordDecisionMidSpan(span, d) // otelgrpc adds its attributes after the pick
	}
}

// unreachableError is the picker's error when every instance it was given
// has a failed connection.
type unreachableError struct {
	service, lane string
	err           error
}

func (e *unreachableError) Error() string {
	l := "baseline request"
	if e.lane != "" {
		l = fmt.Sprintf("lane %q", e.lane)
	}
	msg := fmt.Sprintf("lanes: unreachable: service %q, %s: no instance chosen by the engine has a ready connection", e.service, l)
	if e.err != nil {
		msg += ": " + e.err.Error()
	}
	return msg
}

func (e *unreachableError) Unwrap() error { return e.err }

// reportFunc returns the PickResult.Done of the calls sent to instance id:
// it feeds their outcome to outlier detection, as routing.Result.Report
// would (one function per instance, made once, so that a pick allocates
// nothing).
func reportFunc(svc *routing.Service, id string) func(balancer.DoneInfo) {
	return func(di balancer.DoneInfo) {
		switch outcome(di) {
		case routedcall.Success:
			svc.ReportID(id, true)
		case routedcall.Failure:
			svc.ReportID(id, false)
		}
	}
}

// outcome classifies a finished call for outlier detection, by its status
// code as routedcall.ClassifyGRPC does: Unavailable (which includes every
// connection error) is a failure; DeadlineExceeded and Canceled say nothing
// about the instance (the caller's budget ran out, or it gave up; a lane
// instance paused in a debugger must not be ejected) and are not reported,
// nor is a call that gRPC never sent; everything else, success and
// application errors alike, is a success: the instance answered. A unary
// call cut by the response-header timeout is reported failed by the client
// interceptor (see WithResponseHeaderTimeout). A half-open probe that ends
// unreported is given up by the engine after one ejection period, which
// counts as a failure.
func outcome(di balancer.DoneInfo) routedcall.Outcome {
	if di.Err == nil {
		if !di.BytesSent {
			return routedcall.Ignore // picked, but gRPC found the transport gone
		}
		return routedcall.Success
	}
	return routedcall.ClassifyGRPC(uint32(status.Code(di.Err)))
}

// callKey is the context key of a call's callState.
type callKey struct{}

// callState is what the client interceptors share with the picker for one
// retryable or timed call: the instance of the last attempt, to avoid on the
// next and to report when the attempt timed out.
type callState struct {
	last     atomic.Pointer[string] // points into the engine's snapshot
	svc      atomic.Pointer[routing.Service]
	attempts atomic.Int32 // picks of traced attempts
}

// ejectLast ejects the instance of the last attempt, which did not answer
// within the response-header timeout (routedcall.MarkFailing), and returns
// its id ("" when no attempt was picked).
func (cs *callState) ejectLast() string {
	id, svc := cs.last.Load(), cs.svc.Load()
	if id == nil || svc == nil {
		return ""
	}
	svc.EjectID(*id)
	return *id
}

func withCallState(ctx context.Context) context.Context {
	return context.WithValue(ctx, callKey{}, &callState{})
}

// withCallStateOf returns ctx carrying cs, unless it carries it already.
func withCallStateOf(ctx context.Context, cs *callState) context.Context {
	if callStateFrom(ctx) == cs {
		return ctx
	}
	return context.WithValue(ctx, callKey{}, cs)
}

func callStateFrom(ctx context.Context) *callState {
	cs, _ := ctx.Value(callKey{}).(*callState)
	return cs
}

// lastID returns the instance id of the previous attempt, or "".
func (cs *callState) lastID() string {
	if cs == nil {
		return ""
	}
	if p := cs.last.Load(); p != nil {
		return *p
	}
	return ""
}
