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
package routedcall

import (
	"context"
	"slices"
	"time"

	"github.com/lanesdev/lanes/routing"
)

// DefaultResponseHeaderTimeout is how long an instance may take to start its
// answer (the response headers) before the attempt fails and counts against
// the instance for outlier detection.
const DefaultResponseHeaderTimeout = 10 * time.Second

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
}

// Retryable reports whether an attempt calls for another attempt on another
// instance, before the checks on the budget, the caller and the body: an
// error of an idempotent request, or the guard's refusal, whatever the
// method.
func Retryable(a Attempt, idempotent bool) bool {
	if a.Err != nil {
		return idempotent
	}
	return a.Misdirected
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
// documentation).
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
	if !replayable || c.ctx.Err() != nil {
		return false
	}
	if o == Unreachable {
		if c.moves >= MaxMoves {
			return false
		}
		c.moves++
		return true
	}
	if !retryable || c.retried >= c.retries {
		return false
	}
	c.retried++
	return true
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
