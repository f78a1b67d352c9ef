package httplimit

import (
	"context"
	"sync"
	"time"

	"github.com/ratekit/ratekit"
)

// windowLimiter is a fixed-window counter used to drive the HTTP layer in
// tests. It echoes client state: the new state is the old one plus "+".
type windowLimiter struct {
	mu     sync.Mutex
	policy ratekit.Policy
	used   map[string]int64
	// resetIn is reported as ResetAfter and, on denials, RetryAfter.
	resetIn time.Duration
	calls   int
}

func newWindowLimiter(name string, quota int64) *windowLimiter {
	return &windowLimiter{
		policy:  ratekit.Policy{Name: name, Quota: quota, Window: time.Minute},
		used:    map[string]int64{},
		resetIn: 42500 * time.Millisecond,
	}
}

func (l *windowLimiter) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	if err := req.Validate(); err != nil {
		return ratekit.Decision{}, err
	}
	if req.Cost > l.policy.Quota {
		return ratekit.Decision{}, ratekit.ErrCostExceedsQuota
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	d := ratekit.Decision{Quota: l.policy.Quota, Policy: l.policy, ResetAfter: l.resetIn}
	if req.State != "" {
		d.State = req.State + "+"
	}
	used := l.used[req.Key]
	if used+req.Cost > l.policy.Quota {
		d.Remaining = l.policy.Quota - used
		d.RetryAfter = l.resetIn
		return d, nil
	}
	l.used[req.Key] = used + req.Cost
	d.Allowed = true
	d.Remaining = l.policy.Quota - used - req.Cost
	return d, nil
}

// failingLimiter always fails, after waiting for delay or the context.
type failingLimiter struct {
	err   error
	delay time.Duration
}

func (l failingLimiter) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	if l.delay > 0 {
		select {
		case <-time.After(l.delay):
		case <-ctx.Done():
			return ratekit.Decision{}, ctx.Err()
		}
	}
	return ratekit.Decision{}, l.err
}

// eventLog records observer events in order.
type eventLog struct {
	mu       sync.Mutex
	starts   []ratekit.DecisionStartEvent
	events   []ratekit.DecisionEvent
	failures []ratekit.FailureEvent
	ctxOK    []bool
}

type spanKey struct{}

func (l *eventLog) observer() *ratekit.Observer {
	return &ratekit.Observer{
		DecisionStart: func(ctx context.Context, e ratekit.DecisionStartEvent) context.Context {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.starts = append(l.starts, e)
			return context.WithValue(ctx, spanKey{}, len(l.starts))
		},
		Decision: func(ctx context.Context, e ratekit.DecisionEvent) {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.events = append(l.events, e)
			// The context must be the one DecisionStart returned.
			l.ctxOK = append(l.ctxOK, ctx.Value(spanKey{}) == len(l.starts))
		},
		FailurePolicy: func(ctx context.Context, e ratekit.FailureEvent) {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.failures = append(l.failures, e)
		},
	}
}

// policyLimiter reports its policy like ratekit's strategies do, and fails
// with err when err is set.
type policyLimiter struct {
	*windowLimiter
	err error
	// sawSpan records whether Allow saw the context DecisionStart returned.
	sawSpan bool
}

func (l *policyLimiter) Policy() ratekit.Policy { return l.policy }

func (l *policyLimiter) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	l.sawSpan = ctx.Value(spanKey{}) != nil
	if l.err != nil {
		return ratekit.Decision{}, l.err
	}
	return l.windowLimiter.Allow(ctx, req)
}
