// Package outage tells an operator that a rate limiter's store is failing,
// without flooding the log: the first failure is logged at once with its
// cause, then at most one line per interval (a count of the failures since
// the last line, with the latest error), and one line when the store
// answers again. Lines come from the calls themselves, never from a timer,
// so it works on AWS Lambda, where a frozen instance runs no timers.
//
// Set [Reporter.Observer] as httplimit.GuardConfig.Observer and wrap the
// Guard's limiter with ratekit.Observe and the same observer: the Guard
// reports each failure (its failure policy answered 503, let the call
// through or asked the fallback), and the wrapped limiter each decision
// that the store did make, which ends an outage.
package outage

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratekit/ratekit"
)

// DefaultInterval is the least time between two lines when
// Config.Interval is zero.
const DefaultInterval = 30 * time.Second

// Config configures a [Reporter].
type Config struct {
	// Logger receives the lines (required).
	Logger *slog.Logger

	// Store names the store in the lines, such as "PostgreSQL" or
	// "DynamoDB".
	Store string

	// Interval is the least time between two lines. Zero means
	// DefaultInterval.
	Interval time.Duration

	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Reporter logs a store's failures at a bounded rate. Its methods are safe
// for concurrent use.
type Reporter struct {
	log      *slog.Logger
	store    string
	interval time.Duration
	now      func() time.Time

	// open is true from a failure until the line that says the store
	// answers again: while it is false, a decision costs one atomic load.
	open atomic.Bool

	mu       sync.Mutex
	lastLine time.Time // when the last line was written; zero before the first
	since    time.Time // when the current outage began
	pending  int64     // failures not counted in any line yet
}

// New returns a Reporter.
func New(cfg Config) *Reporter {
	r := &Reporter{log: cfg.Logger, store: cfg.Store, interval: cfg.Interval, now: cfg.Now}
	if r.interval <= 0 {
		r.interval = DefaultInterval
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.store == "" {
		r.store = "store"
	}
	return r
}

// Observer returns an observer whose FailurePolicy reports failures to r and
// whose Decision reports the store's answers (decisions made, allowed or
// denied) to r. Set it as httplimit.GuardConfig.Observer and pass it to
// ratekit.Observe for the Guard's limiter.
func (r *Reporter) Observer() *ratekit.Observer {
	return &ratekit.Observer{
		FailurePolicy: func(_ context.Context, e ratekit.FailureEvent) { r.Failure(e) },
		Decision: func(_ context.Context, e ratekit.DecisionEvent) {
			if e.Outcome != ratekit.OutcomeError {
				r.Answered()
			}
		},
	}
}

// Failure records a failure of the store. The first one of an outage is
// logged at once, with its cause, unless a line was written less than an
// interval ago; the others are counted and logged in a summary at most once
// per interval.
func (r *Reporter) Failure(e ratekit.FailureEvent) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.open.Load() {
		r.open.Store(true)
		r.since = now
		if r.lastLine.IsZero() || now.Sub(r.lastLine) >= r.interval {
			r.lastLine, r.pending = now, 0
			r.log.Error(r.store+" failed: "+consequence(e.Action),
				append(attrs(e), "store", r.store, "next_report_after", r.interval.String())...)
			return
		}
	}
	r.pending++
	if now.Sub(r.lastLine) >= r.interval {
		r.log.Error(r.store+" still failing: "+consequence(e.Action),
			append(attrs(e), "store", r.store, "failures", r.pending,
				"failing_for", now.Sub(r.since).Round(time.Second).String())...)
		r.lastLine, r.pending = now, 0
	}
}

// Answered records that the store made a decision. When an outage is open
// and the last line is an interval old, it logs that the store answers
// again (with the failures not yet counted in a line) and ends the outage;
// earlier, it waits for a later answer, so that a store that fails and
// answers in turn still writes at most a line per interval.
func (r *Reporter) Answered() {
	if !r.open.Load() {
		return
	}
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.open.Load() || now.Sub(r.lastLine) < r.interval {
		return
	}
	r.log.Info(r.store+" answers again",
		"store", r.store, "failures_since_last_line", r.pending,
		"outage", now.Sub(r.since).Round(time.Second).String())
	r.lastLine, r.pending = now, 0
	r.open.Store(false)
}

func consequence(a ratekit.FailureAction) string {
	switch a {
	case ratekit.FailedClosed:
		return "calls are refused with 503 (fail closed) while it fails"
	case ratekit.FailedOpen:
		return "calls go through unlimited (fail open) while it fails"
	case ratekit.FellBack:
		return "the fallback limiter decides while it fails"
	}
	return "the failure policy acts while it fails"
}

func attrs(e ratekit.FailureEvent) []any {
	a := []any{"action", e.Action.String(), "error_class", e.ErrorClass.String()}
	if e.Policy != "" {
		a = append(a, "policy", e.Policy)
	}
	if e.Err != nil {
		a = append(a, "error", e.Err.Error())
	}
	if e.FallbackErr != nil {
		a = append(a, "fallback_error", e.FallbackErr.Error())
	}
	return a
}
