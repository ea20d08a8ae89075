// Package routedcall is the routed call that every lanes client makes: the
// pick of an instance, the classification of each attempt's outcome, its
// report to outlier detection, and the decision to go on to another
// instance. laneshttp.Transport, the gateway's upstream transport and the
// lanes gRPC picker all drive it; it knows nothing of net/http, fasthttp or
// grpc-go, so that any wire can reuse it.
//
// The rules, written here once:
//
//   - An attempt whose request never left (the connection was refused, or
//     the dial failed) is Unreachable: the instance is marked failing at once
//     (ejected, so that the next pick goes to the next eligible instance or
//     along the lane's fallback chain), and the call moves on within the same
//     call, whatever the method: nothing was sent. These moves do not spend
//     the retry budget; at most MaxMoves of them are made.
//   - Any other error is a Failure, unless the caller gave up (its context is
//     done): that says nothing about the instance and is ignored, except when
//     the attempt had already taken longer than the response-header timeout,
//     which counts as a Failure like the timeout itself.
//   - An answer with a 5xx status is a Failure, unless it names a routing
//     failure further downstream (X-Lanes-Error): a healthy instance answered.
//     Every other answer is a Success.
//   - An answer whose body breaks off because the instance stalled in the
//     middle of it (it sent nothing for the upstream read timeout) is a
//     Failure, reported by BodyStalled after the Success that its head
//     counted: the client got a cut answer. It is never retried: the
//     answer had started.
//   - A failed attempt is retried, on an instance that has not failed this
//     call, when the caller allows it (an idempotent request whose body can be
//     sent again) and the retry budget is not spent. The retry's pick (Repick)
//     is another eligible instance of the same lane while there is one; once
//     every eligible instance of the lane has failed this call, they count as
//     absent for the rest of the call, and the retry follows the lane chain as
//     for a lane with no instance: the lane's fallback lanes, then the
//     baseline, or no retry when the lane is strict. A baseline request is
//     never retried on a lane instance. When no instance is left, the call
//     ends with the last attempt's outcome.
//
// # Running a call
//
// [Call.Run] is the routed call, whole: a client gives it its [Config] (the
// same for every call), the call's [Spec], and a [Sender] that makes the
// attempts on its wire; Run picks, has the sender send, classifies, reports
// and goes on to another instance as the rules above say, and writes the
// call's client span and counts its routing decision. The sender says how
// each attempt ended ([Attempt]), whether the request can be sent again,
// and discards an answer that another attempt replaces; the last attempt's
// answer is the sender's to return. laneshttp.Transport and the gateway (a
// sender per HTTP/1.1 stack) run their calls so.
// Start, Again, Next and Report are the steps that Run orders; Report also
// serves a sender that learns an attempt's outcome after the call (a gRPC
// answer, whose status comes with its trailers: see [Attempt.Final]).
//
// The lanes gRPC client does not run its calls here: grpc-go makes the
// attempts (its picker is asked for each, its retry policy decides the
// retries, and each outcome comes back in a DoneInfo), so its picker applies
// the same rules piecewise: [Repick], [MarkFailing] and [ClassifyGRPC].
package routedcall

import (
	"context"
	"slices"
	"time"

	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/lanesdev/lanes/internal/lib/hopspan"
	"github.com/lanesdev/lanes/lanesmetrics"
	"github.com/lanesdev/lanes/routing"
)

// DefaultResponseHeaderTimeout is how long an instance may take to start its
// answer (the response headers) before the attempt fails and counts against
// the instance for outlier detection.
const DefaultResponseHeaderTimeout = 10 * time.Second

// DefaultRetries is how many failed attempts of a call may be retried when
// the setting is 0 (Config.Retries).
const DefaultRetries = 1

// MaxMoves bounds how many unreachable instances one call moves past.
const MaxMoves = 8

// maxFailed bounds the instances that one call remembers as failed.
const maxFailed = 8

// HeaderTimeout returns the response-header timeout of the setting d: 0
// means DefaultResponseHeaderTimeout, a negative value none (0).
func HeaderTimeout(d time.Duration) time.Duration {
	return Timeout(d, DefaultResponseHeaderTimeout)
}

// Timeout returns the timeout of a setting d whose default is def, as every
// timeout of a lanes client reads its setting: 0 means def, a negative value
// none (0).
func Timeout(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	}
	return d
}

// Outcome is what one attempt says about the health of the instance that
// served it, for outlier detection.
type Outcome uint8

const (
	// Ignore reports nothing: the attempt says nothing about the instance
	// (for example, the caller gave up).
	Ignore Outcome = iota
	// Success reports the instance healthy.
	Success
	// Failure reports a failure, which counts towards ejection.
	Failure
	// Unreachable reports that the request never reached the instance (its
	// connection was refused): the instance is marked failing at once and
	// the call moves on to another.
	Unreachable
)

func (o Outcome) String() string {
	switch o {
	case Ignore:
		return "ignore"
	case Success:
		return "success"
	case Failure:
		return "failure"
	case Unreachable:
		return "unreachable"
	}
	return "unknown"
}

// Attempt is how one attempt ended, in terms of no particular wire library.
type Attempt struct {
	// Err is the error of an attempt that got no answer; nil when answered.
	Err error
	// Unsent reports that Err came before any byte of the request was
	// sent: a refused connection or a failed dial.
	Unsent bool
	// CallerGone reports that the caller's context was done when the
	// attempt ended.
	CallerGone bool
	// Status is the HTTP status of the answer.
	Status int
	// Downstream reports that the answer names a routing failure further
	// downstream (the X-Lanes-Error header).
	Downstream bool
	// Misdirected reports that the answer is the guard's refusal (421 with
	// X-Lanes-Error: misdirected): no handler saw the request.
	Misdirected bool
	// RetryStatus reports that the client retries an answer of this
	// status, when the request is idempotent, as it would an error
	// (laneshttp's WithRetryStatus).
	RetryStatus bool

	// Final reports that the answer is returned as it is, neither
	// classified nor retried by Run: the sender reports its outcome itself
	// (Call.Report) once it knows it, as for a gRPC answer whose status
	// comes with the trailers. Status and Err still describe it for the
	// client span.
	Final bool
	// Classified reports that Outcome is the attempt's outcome by the
	// client's own rules (laneshttp's WithClassify), which Run then uses
	// instead of Classify.
	Classified bool
	Outcome    Outcome
}

// Retryable reports whether an attempt calls for another attempt on another
// instance, before the checks on the budget, the caller and the body: an
// error of an idempotent request, an answer whose status the client retries
// (RetryStatus) of an idempotent request, or the guard's refusal, whatever
// the method.
func Retryable(a Attempt, idempotent bool) bool {
	if a.Err != nil {
		return idempotent
	}
	return a.Misdirected || a.RetryStatus && idempotent
}

// Idempotent reports whether a request of the given method may be sent
// twice, as net/http decides: GET, HEAD, OPTIONS, TRACE, PUT and DELETE (and
// "", which means GET), or any method with an Idempotency-Key or
// X-Idempotency-Key header (hasKey).
func Idempotent(method string, hasKey bool) bool {
	switch method {
	case "", "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE":
		return true
	}
	return hasKey
}

// IdempotentRequest is Idempotent for a request of method whose header
// fields h holds (an http.Header, say): hasKey is whether h has an
// Idempotency-Key or X-Idempotency-Key field, whatever its value (an empty
// one too). Every routed call that decides a request's idempotency from its
// headers decides it here.
func IdempotentRequest(method string, h interface{ Values(key string) []string }) bool {
	return Idempotent(method, len(h.Values("Idempotency-Key")) > 0 || len(h.Values("X-Idempotency-Key")) > 0)
}

// Classify is the default classification of an attempt (see the package
// documentation). It ignores Classified and Outcome.
func Classify(a Attempt) Outcome {
	if a.Err != nil {
		switch {
		case a.CallerGone:
			return Ignore
		case a.Unsent:
			return Unreachable
		}
		return Failure
	}
	if a.Status >= 500 && !a.Downstream {
		return Failure
	}
	return Success
}

// gRPC status codes that classification distinguishes.
const (
	grpcCanceled         = 1
	grpcDeadlineExceeded = 4
	grpcUnavailable      = 14
)

// ClassifyGRPC classifies a finished gRPC call by its status code:
// Unavailable, which includes every connection error, is a Failure;
// DeadlineExceeded and Canceled say nothing about the instance (the caller's
// budget ran out, or it gave up) and are ignored; everything else, success
// and application errors alike, is a Success: the instance answered.
func ClassifyGRPC(code uint32) Outcome {
	switch code {
	case grpcUnavailable:
		return Failure
	case grpcCanceled, grpcDeadlineExceeded:
		return Ignore
	}
	return Success
}

// MarkFailing ejects the instance of pick at once (routing.Result.Eject), as
// if it had failed as many calls as the policy's outlier detection needs to
// eject it. An ejected instance leaves every eligible set until its
// ejection ends, so that the next pick goes to another instance of its lane
// or along the fallback chain.
func MarkFailing(pick routing.Result) {
	pick.Eject()
}

// BodyStalled reports to outlier detection, as a Failure of the instance of
// pick, an answer whose body the instance stopped sending in the middle
// (see the package documentation). It may come after the call's report,
// and after the call itself has ended (a body that streams on).
func BodyStalled(pick routing.Result) {
	pick.Report(false)
}

// Call is one routed call in progress. The zero value is not ready: Start
// it. A Call is used by one goroutine at a time, and must not be copied
// after Start.
type Call struct {
	ctx     context.Context
	svc     *routing.Service
	req     routing.Request
	retries int           // retries after failures, at most
	timeout time.Duration // response-header timeout; 0: none

	pick     routing.Result
	begun    int64 // when the current attempt began, Unix ns
	reported bool
	retried  int
	moves    int
	failed   [maxFailed]string // ids of the instances that failed this call
	nfailed  int
}

// Start begins a call of svc for req, made with ctx, and
// returns the first pick. retries is how many failed attempts may be
// retried; timeout is the response-header timeout (0: none), which decides
// how an attempt that the caller abandoned counts, and whether a failed one
// ejects its instance at once.
func (c *Call) Start(ctx context.Context, svc *routing.Service, req routing.Request, retries int, timeout time.Duration) (routing.Result, error) {
	*c = Call{ctx: ctx, svc: svc, req: req, retries: retries, timeout: timeout}
	p, err := svc.Pick(req)
	if err != nil {
		return p, err
	}
	c.pick = p
	c.begin()
	return p, nil
}

// Pick returns the current pick.
func (c *Call) Pick() routing.Result { return c.pick }

// Started reports whether Start picked an instance.
func (c *Call) Started() bool { return c.pick.Instance != nil }

// PickErr returns err when it is the error of a call that never picked an instance (Start
// failed), and nil otherwise: the error a description of the routing decision names.
func (c *Call) PickErr(err error) error {
	if c.Started() {
		return nil
	}
	return err
}

// Retries returns how many times the call went on to another instance: retries after failures,
// and moves past unreachable instances.
func (c *Call) Retries() int { return c.retried + c.moves }

// Retried reports whether the current pick is not the call's first.
func (c *Call) Retried() bool { return c.retried+c.moves > 0 }

func (c *Call) begin() {
	c.reported = false
	if c.timeout > 0 {
		c.begun = time.Now().UnixNano()
	}
}

// CallerGone reports whether the caller's context is done.
func (c *Call) CallerGone() bool { return c.ctx.Err() != nil }

// Report feeds the outcome of the attempt on the current pick to outlier
// detection, once per pick: later reports on the same pick are ignored. An
// Ignore for an attempt that the caller abandoned after the instance took
// longer than the response-header timeout counts as a Failure; an
// Unreachable, and a Failure of an attempt that took the whole
// response-header timeout (the instance hangs), mark the instance failing
// (MarkFailing).
func (c *Call) Report(o Outcome) {
	if c.reported {
		return
	}
	c.reported = true
	timedOut := c.timedOut()
	if o == Ignore && timedOut && c.ctx.Err() != nil {
		o = Failure
	}
	switch {
	case o == Success:
		c.pick.Report(true)
	case o == Unreachable, o == Failure && timedOut:
		// A refused connection, or no answer within the response-header
		// timeout: the instance ejects at once, so that a hung instance
		// costs one timeout, not one per failure in the window.
		MarkFailing(c.pick)
	case o == Failure:
		c.pick.Report(false)
	}
}

// timedOut reports whether the current attempt has taken at least the
// response-header timeout.
func (c *Call) timedOut() bool {
	return c.timeout > 0 && time.Now().UnixNano()-c.begun >= int64(c.timeout)
}

// Again reports the outcome o of the attempt on the current pick (as Report
// does) and decides whether the call goes on to another attempt: after an
// Unreachable when the request can be sent again (replayable), after any
// other outcome when the caller also allows a retry (retryable: an
// idempotent request, a status it retries) and the budget is not spent;
// never once the caller gave up. When it returns true, call Next.
func (c *Call) Again(o Outcome, retryable, replayable bool) bool {
	c.Report(o)
	if !replayable || !c.may(o, retryable) {
		return false
	}
	c.spend(o)
	return true
}

// may reports whether the rules let the call go on after an attempt that
// ended o (retryable: the client allows a retry), the body aside.
func (c *Call) may(o Outcome, retryable bool) bool {
	switch {
	case c.ctx.Err() != nil:
		return false
	case o == Unreachable:
		return c.moves < MaxMoves
	}
	return retryable && c.retried < c.retries
}

// spend counts the move or the retry that may allowed.
func (c *Call) spend(o Outcome) {
	if o == Unreachable {
		c.moves++
	} else {
		c.retried++
	}
}

// Next picks the instance of the next attempt (Repick: one that has not
// failed this call, along the lane chain when every eligible instance of the
// lane has), and reports whether it found one. Call it after Again returned
// true.
func (c *Call) Next() (routing.Result, bool) {
	if c.nfailed < len(c.failed) && !slices.Contains(c.failed[:c.nfailed], c.pick.Instance.ID) {
		c.failed[c.nfailed] = c.pick.Instance.ID
		c.nfailed++
	}
	p, err := Repick(c.svc, c.req, c.failed[:c.nfailed])
	if err != nil {
		return p, false
	}
	c.pick = p
	c.begin()
	return p, true
}

// Repick is the pick of a retry of req, whose earlier attempts failed on the
// instances with the ids failed: svc's usual pick when it is an instance that
// has not failed the call, or a half-open probe (which must be sent), and
// otherwise svc.PickWithout, which leaves the failed instances out: another
// eligible instance of the lane, or, once every one has failed, the next
// lane of the chain (see routing.Service.PickWithout). It fails when no
// instance that has not failed may serve the request.
func Repick(svc *routing.Service, req routing.Request, failed []string) (routing.Result, error) {
	p, err := svc.Pick(req)
	if err != nil || p.Probe() || !slices.Contains(failed, p.Instance.ID) {
		return p, err
	}
	return svc.PickWithout(req, failed...)
}

// Config is how a client makes its routed calls: the same for each of its
// calls, set up once and only read by Run. The zero Config retries a failed
// attempt once (DefaultRetries), bounds each attempt by
// DefaultResponseHeaderTimeout, and writes no span and counts nothing.
type Config struct {
	// Engine tells the reasons of the routing decision (an ejected lane,
	// an expired one) that the span and the metrics record; nil tells
	// fewer.
	Engine *routing.Engine
	// Retries is how many failed attempts may be retried: 0 means
	// DefaultRetries, a negative value none. Moves past an unreachable
	// instance do not count.
	Retries int
	// ResponseHeaderTimeout is how long an instance may take to start its
	// answer, which decides how an abandoned attempt counts and whether a
	// failed one ejects its instance at once (see Call.Report): 0 means
	// DefaultResponseHeaderTimeout, a negative value none. The sender
	// enforces it on its wire.
	ResponseHeaderTimeout time.Duration
	// Tracer, when set, writes the client span of each call (see Run).
	Tracer trace.Tracer
	// Metrics, when set, counts the routing decision of each call.
	Metrics *lanesmetrics.Requests
}

// retries is the retry budget of the setting Retries.
func (cfg *Config) retries() int {
	switch {
	case cfg.Retries == 0:
		return DefaultRetries
	case cfg.Retries < 0:
		return 0
	}
	return cfg.Retries
}

// Spec is what one call is.
type Spec struct {
	// Service is the service called.
	Service *routing.Service
	// Request is what the engine routes by: the request's lane, key, and
	// the caller's zone and host.
	Request routing.Request
	// Method is the request's method: the name of the client span.
	Method string
	// Idempotent reports whether the request may be sent twice: whether a
	// failed attempt may be retried.
	Idempotent bool
}

// A Sender makes the attempts of one routed call on one wire.
type Sender interface {
	// Send makes an attempt on pick, with ctx (the call's context, with
	// its client span when it is traced: write its trace context on the
	// request), and describes how it ended.
	Send(ctx context.Context, pick routing.Result) Attempt
	// Replayable reports whether the request can be sent again after an
	// attempt that ended o. Run asks it only when the rules let the call
	// go on, before the next pick, so that it may make the next attempt's
	// copy of the body (and say false when it cannot); a copy that no
	// attempt sends (no instance was left) is the sender's to close.
	Replayable(o Outcome) bool
	// Drop discards the answer of an attempt that another attempt follows.
	Drop()
}

// Run makes the routed call sp with s, as the package documentation says:
// it picks an instance (Start), has s send each attempt, classifies it
// (Classify, unless the attempt is Classified or Final), reports it to
// outlier detection, and goes on to another instance while the rules let it
// (retries after failures within cfg's budget for an idempotent request,
// moves past unreachable instances for any request whose body can be sent
// again). The last attempt's answer, or error, is the sender's; Run returns
// only the routing error of a call that no instance may serve (nothing was
// sent).
//
// With cfg.Tracer, Run writes the call's HTTP client span, a child of ctx's
// span, named sp.Method, and gives the attempts its context (a span that is
// not sampled is dropped at once, and the attempts get ctx): it carries the routing decision (the lanestrace
// attributes: the lane requested and served, the reason, the instance, the
// retries) and the last attempt's status or error. With cfg.Metrics, it
// counts the decision. Untraced and uncounted, Run allocates nothing.
//
// The Call holds the call's state after Run returns (Pick, Retries, and
// Report for a Final answer); do not Run it again until that is done with.
func (c *Call) Run(ctx context.Context, cfg *Config, sp Spec, s Sender) error {
	var span trace.Span // nil when not traced
	if cfg.Tracer != nil {
		sctx, s := cfg.Tracer.Start(ctx, sp.Method, trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(semconv.HTTPRequestMethodKey.String(sp.Method), semconv.ServerAddress(sp.Service.Name())))
		if s.IsRecording() {
			ctx, span = sctx, s
		} else {
			s.End() // the attempts go with the caller's context
		}
	}
	pick, err := c.Start(ctx, sp.Service, sp.Request, cfg.retries(), HeaderTimeout(cfg.ResponseHeaderTimeout))
	var last Attempt
	if err == nil {
		last = c.attempts(ctx, pick, sp.Idempotent, s)
	}
	if span != nil || cfg.Metrics != nil {
		d := hopspan.DecisionOf(cfg.Engine, sp.Service, sp.Request.Lane, c.pick, err, c.Retries())
		cfg.Metrics.Observe(d.Service, d.Requested, d.Served, d.Reason)
		if span != nil {
			end := err
			if end == nil {
				end = last.Err
			}
			hopspan.EndStatus(span, d, last.Status, end)
		}
	}
	return err
}

// attempts makes the attempts of a started call, and returns the last.
func (c *Call) attempts(ctx context.Context, pick routing.Result, idempotent bool, s Sender) Attempt {
	for {
		a := s.Send(ctx, pick)
		if a.Final {
			return a
		}
		o := a.Outcome
		if !a.Classified {
			o = Classify(a)
		}
		c.Report(o)
		if !c.may(o, Retryable(a, idempotent)) || !s.Replayable(o) {
			return a
		}
		next, ok := c.Next()
		if !ok {
			return a
		}
		c.spend(o)
		s.Drop()
		pick = next
	}
}
