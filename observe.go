package ratekit

import (
	"context"
	"errors"
	"time"
)

// Observer receives what limiters decide and what a httplimit.Guard's failure policy
// does, for metrics, traces and logs. Any field may be nil. [Observe] calls
// DecisionStart and Decision around every call of a wrapped limiter;
// a Guard calls FailurePolicy through httplimit.GuardConfig.Observer.
//
// Events never carry the request's key (keys are IP addresses and API keys)
// or its client state, and every field meant to become a metric label
// ([Op], [Outcome], [ErrorClass], [FailureAction], the policy name) takes
// few values. The functions are called synchronously on the decision path,
// possibly from many goroutines at once: they must be safe for concurrent
// use and should return quickly.
type Observer struct {
	// DecisionStart, when set, is called before each Allow, Peek and
	// Refund of a limiter wrapped by Observe. The context it returns is the
	// one passed to the limiter and then to Decision, so a tracer can start
	// a span here that store clients' own instrumentation nests under.
	// Returning ctx unchanged is fine; it must not return nil.
	DecisionStart func(ctx context.Context, e DecisionStartEvent) context.Context

	// Decision, when set, is called after each Allow, Peek and Refund of a
	// limiter wrapped by Observe, with the outcome.
	Decision func(ctx context.Context, e DecisionEvent)

	// FailurePolicy, when set, is called by a Guard each time its limiter
	// fails and its failure policy acts: it failed open, failed closed or
	// asked the fallback.
	FailurePolicy func(ctx context.Context, e FailureEvent)
}

// Op is the limiter operation an event reports.
type Op uint8

// The operations [Observe] reports.
const (
	OpAllow  Op = iota + 1 // Limiter.Allow
	OpPeek                 // Peeker.Peek
	OpRefund               // Refunder.Refund
)

// String returns "allow", "peek" or "refund".
func (op Op) String() string {
	switch op {
	case OpAllow:
		return "allow"
	case OpPeek:
		return "peek"
	case OpRefund:
		return "refund"
	}
	return "unknown"
}

// Outcome is how a limiter call ended.
type Outcome uint8

// The outcomes of a limiter call.
const (
	OutcomeAllowed Outcome = iota + 1 // a Decision with Allowed true
	OutcomeDenied                     // a Decision with Allowed false
	OutcomeError                      // no decision: the call returned an error
)

// String returns "allowed", "denied" or "error".
func (o Outcome) String() string {
	switch o {
	case OutcomeAllowed:
		return "allowed"
	case OutcomeDenied:
		return "denied"
	case OutcomeError:
		return "error"
	}
	return "unknown"
}

// ErrorClass sorts a limiter error into a small closed set, so that errors
// can be counted by kind without their messages (which may hold anything).
// Use [ClassifyError] to derive it.
type ErrorClass uint8

// The classes of limiter errors, as [ClassifyError] derives them.
const (
	// ErrorNone is the class of a nil error.
	ErrorNone ErrorClass = iota

	// ErrorInvalidRequest: the request was malformed
	// (errors.Is ErrInvalidRequest); the store was not at fault.
	ErrorInvalidRequest

	// ErrorCanceled: the context was canceled (errors.Is
	// context.Canceled), normally because the caller gave up.
	ErrorCanceled

	// ErrorDeadline: a deadline passed (errors.Is
	// context.DeadlineExceeded), the caller's or httplimit.GuardConfig.Timeout's: the
	// store was too slow for the time given.
	ErrorDeadline

	// ErrorStore: any other error, normally the store failing.
	ErrorStore
)

// String returns "", "invalid_request", "canceled", "deadline" or "store",
// the values ratekit's instrumentation uses for the OpenTelemetry error.type
// attribute.
func (c ErrorClass) String() string {
	switch c {
	case ErrorNone:
		return ""
	case ErrorInvalidRequest:
		return "invalid_request"
	case ErrorCanceled:
		return "canceled"
	case ErrorDeadline:
		return "deadline"
	case ErrorStore:
		return "store"
	}
	return "unknown"
}

// ClassifyError returns the [ErrorClass] of err, decided with errors.Is
// (never from the error's text): ErrorNone for nil, then the first of
// ErrorInvalidRequest, ErrorCanceled, ErrorDeadline that matches, else
// ErrorStore.
func ClassifyError(err error) ErrorClass {
	switch {
	case err == nil:
		return ErrorNone
	case errors.Is(err, ErrInvalidRequest):
		return ErrorInvalidRequest
	case errors.Is(err, context.Canceled):
		return ErrorCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return ErrorDeadline
	}
	return ErrorStore
}

// DecisionStartEvent is what [Observer.DecisionStart] learns before a
// limiter call.
type DecisionStartEvent struct {
	// Op is the operation about to run.
	Op Op

	// Policy is the limiter's policy name, or "" when the limiter does not
	// report one (see [Observe]).
	Policy string

	// Cost is the request's Cost, as given (not yet validated).
	Cost int64
}

// DecisionEvent is what [Observer.Decision] learns after a limiter call.
type DecisionEvent struct {
	// Op is the operation that ran.
	Op Op

	// Policy is the policy name of the Decision, or, when the call failed,
	// the limiter's policy name; "" when neither is known.
	Policy string

	// Outcome is allowed, denied or error.
	Outcome Outcome

	// Cost is the request's Cost, as given.
	Cost int64

	// Quota and Remaining are the Decision's, 0 on an error.
	Quota, Remaining int64

	// Duration is the wall time the limiter took, measured on the
	// monotonic clock.
	Duration time.Duration

	// ErrorClass is ClassifyError(Err).
	ErrorClass ErrorClass

	// Err is the error the limiter returned, nil unless Outcome is
	// OutcomeError. Its text may contain anything the store put there;
	// use ErrorClass for labels.
	Err error
}

// FailureAction is what a httplimit.Guard's failure policy did with a limiter
// failure.
type FailureAction uint8

// The actions of a failure policy.
const (
	// FailedOpen: the request went on without a decision (FailOpen).
	FailedOpen FailureAction = iota + 1

	// FailedClosed: the request was answered with 503 (FailClosed, or
	// UseFallback when the fallback failed too).
	FailedClosed

	// FellBack: the fallback limiter decided (UseFallback).
	FellBack
)

// String returns "fail_open", "fail_closed" or "fallback".
func (a FailureAction) String() string {
	switch a {
	case FailedOpen:
		return "fail_open"
	case FailedClosed:
		return "fail_closed"
	case FellBack:
		return "fallback"
	}
	return "unknown"
}

// FailureEvent is what [Observer.FailurePolicy] learns when a httplimit.Guard's
// limiter fails with an error other than an invalid request.
type FailureEvent struct {
	// Policy is the failed limiter's policy name, or "" when it does not
	// report one (see [Observe]).
	Policy string

	// Action is what the failure policy did.
	Action FailureAction

	// ErrorClass is ClassifyError(Err).
	ErrorClass ErrorClass

	// Err is the limiter's error.
	Err error

	// FallbackErr is the fallback's error when the fallback was asked and
	// failed too (Action is FailedClosed); nil otherwise.
	FallbackErr error
}

// Observe returns a [Limiter] that reports every Allow, and every Peek and
// Refund, of l to o, and otherwise behaves exactly as l: it returns l's
// decisions and errors unchanged, and it implements [Peeker], [Refunder]
// and [Resetter] exactly when l does (Reset is passed through, not
// observed). If o is nil, or has neither DecisionStart nor Decision set,
// Observe returns l itself, so an unobserved limiter costs nothing.
//
// When l has a method Policy() Policy, as every ratekit strategy has, its
// name is reported for calls that fail; otherwise failed calls report the
// policy name "".
//
// The returned limiter is safe for concurrent use when l and o are.
func Observe(l Limiter, o *Observer) Limiter {
	if o == nil || (o.DecisionStart == nil && o.Decision == nil) || l == nil {
		return l
	}
	b := &observed{l: l, start: o.DecisionStart, done: o.Decision}
	if p, ok := l.(interface{ Policy() Policy }); ok {
		b.policy = p.Policy()
	}
	p, isP := l.(Peeker)
	r, isR := l.(Refunder)
	s, isS := l.(Resetter)
	b.peeker, b.refunder, b.resetter = p, r, s
	switch {
	case isP && isR && isS:
		return struct {
			*observed
			peek
			refund
			reset
		}{b, peek{b}, refund{b}, reset{b}}
	case isP && isR:
		return struct {
			*observed
			peek
			refund
		}{b, peek{b}, refund{b}}
	case isP && isS:
		return struct {
			*observed
			peek
			reset
		}{b, peek{b}, reset{b}}
	case isR && isS:
		return struct {
			*observed
			refund
			reset
		}{b, refund{b}, reset{b}}
	case isP:
		return struct {
			*observed
			peek
		}{b, peek{b}}
	case isR:
		return struct {
			*observed
			refund
		}{b, refund{b}}
	case isS:
		return struct {
			*observed
			reset
		}{b, reset{b}}
	}
	return b
}

type observed struct {
	l        Limiter
	peeker   Peeker
	refunder Refunder
	resetter Resetter
	start    func(context.Context, DecisionStartEvent) context.Context
	done     func(context.Context, DecisionEvent)
	policy   Policy
}

// Policy returns the policy of the observed limiter (the zero Policy when it
// has no Policy method), so that an observed limiter names its policy too.
func (o *observed) Policy() Policy { return o.policy }

func (o *observed) Allow(ctx context.Context, req Request) (Decision, error) {
	return o.call(ctx, OpAllow, req, o.l.Allow)
}

func (o *observed) call(ctx context.Context, op Op, req Request, f func(context.Context, Request) (Decision, error)) (Decision, error) {
	if o.start != nil {
		ctx = o.start(ctx, DecisionStartEvent{Op: op, Policy: o.policy.Name, Cost: req.Cost})
	}
	t0 := time.Now()
	d, err := f(ctx, req)
	elapsed := time.Since(t0)
	if o.done != nil {
		e := DecisionEvent{Op: op, Policy: o.policy.Name, Cost: req.Cost, Duration: elapsed}
		switch {
		case err != nil:
			e.Outcome, e.Err, e.ErrorClass = OutcomeError, err, ClassifyError(err)
		case d.Allowed:
			e.Outcome = OutcomeAllowed
		default:
			e.Outcome = OutcomeDenied
		}
		if err == nil {
			e.Quota, e.Remaining = d.Quota, d.Remaining
			if d.Policy.Name != "" {
				e.Policy = d.Policy.Name
			}
		}
		o.done(ctx, e)
	}
	return d, err
}

type peek struct{ o *observed }

func (p peek) Peek(ctx context.Context, req Request) (Decision, error) {
	return p.o.call(ctx, OpPeek, req, p.o.peeker.Peek)
}

type refund struct{ o *observed }

func (r refund) Refund(ctx context.Context, req Request) (Decision, error) {
	return r.o.call(ctx, OpRefund, req, r.o.refunder.Refund)
}

type reset struct{ o *observed }

func (r reset) Reset(ctx context.Context, key string) error {
	return r.o.resetter.Reset(ctx, key)
}
