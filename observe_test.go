package ratekit

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
)

func TestClassifyError(t *testing.T) {
	store := errors.New("connection refused")
	tests := []struct {
		err  error
		want ErrorClass
		name string
	}{
		{nil, ErrorNone, ""},
		{ErrEmptyKey, ErrorInvalidRequest, "invalid_request"},
		{fmt.Errorf("tokenbucket: %w", ErrCostExceedsQuota), ErrorInvalidRequest, "invalid_request"},
		{context.Canceled, ErrorCanceled, "canceled"},
		{fmt.Errorf("redis: %w", context.Canceled), ErrorCanceled, "canceled"},
		{fmt.Errorf("pg: %w", context.DeadlineExceeded), ErrorDeadline, "deadline"},
		{store, ErrorStore, "store"},
		// The text says "invalid request", but only errors.Is counts.
		{errors.New("ratekit: invalid request"), ErrorStore, "store"},
		{errors.Join(store, context.DeadlineExceeded), ErrorDeadline, "deadline"},
	}
	for _, tt := range tests {
		got := ClassifyError(tt.err)
		if got != tt.want || got.String() != tt.name {
			t.Errorf("ClassifyError(%v) = %v (%q), want %v (%q)", tt.err, got, got.String(), tt.want, tt.name)
		}
	}
}

func TestObserveStrings(t *testing.T) {
	for _, tt := range []struct{ got, want string }{
		{OpAllow.String(), "allow"}, {OpPeek.String(), "peek"}, {OpRefund.String(), "refund"}, {Op(0).String(), "unknown"},
		{OutcomeAllowed.String(), "allowed"}, {OutcomeDenied.String(), "denied"}, {OutcomeError.String(), "error"}, {Outcome(9).String(), "unknown"},
		{FailedOpen.String(), "fail_open"}, {FailedClosed.String(), "fail_closed"}, {FellBack.String(), "fallback"}, {FailureAction(0).String(), "unknown"},
		{ErrorClass(200).String(), "unknown"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

// eventLog records observer events in order.
type eventLog struct {
	mu       sync.Mutex
	starts   []DecisionStartEvent
	events   []DecisionEvent
	failures []FailureEvent
	ctxOK    []bool
}

type spanKey struct{}

func (l *eventLog) observer() *Observer {
	return &Observer{
		DecisionStart: func(ctx context.Context, e DecisionStartEvent) context.Context {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.starts = append(l.starts, e)
			return context.WithValue(ctx, spanKey{}, len(l.starts))
		},
		Decision: func(ctx context.Context, e DecisionEvent) {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.events = append(l.events, e)
			// The context must be the one DecisionStart returned.
			l.ctxOK = append(l.ctxOK, ctx.Value(spanKey{}) == len(l.starts))
		},
		FailurePolicy: func(ctx context.Context, e FailureEvent) {
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

func (l *policyLimiter) Policy() Policy { return l.policy }

func (l *policyLimiter) Allow(ctx context.Context, req Request) (Decision, error) {
	l.sawSpan = ctx.Value(spanKey{}) != nil
	if l.err != nil {
		return Decision{}, l.err
	}
	return l.windowLimiter.Allow(ctx, req)
}

func TestObserveDecisions(t *testing.T) {
	var log eventLog
	storeErr := errors.New("store down")
	pl := &policyLimiter{windowLimiter: newWindowLimiter("api", 2)}
	l := Observe(pl, log.observer())
	ctx := context.Background()

	type step struct {
		req     Request
		err     error // the limiter's error, set before the call
		outcome Outcome
		class   ErrorClass
		remain  int64
	}
	steps := []step{
		{req: Request{Key: "1.2.3.4", Cost: 1}, outcome: OutcomeAllowed, remain: 1},
		{req: Request{Key: "1.2.3.4", Cost: 1}, outcome: OutcomeAllowed, remain: 0},
		{req: Request{Key: "1.2.3.4", Cost: 1}, outcome: OutcomeDenied, remain: 0},
		{req: Request{Key: "1.2.3.4", Cost: 0}, outcome: OutcomeError, class: ErrorInvalidRequest},
		{req: Request{Key: "1.2.3.4", Cost: 3}, outcome: OutcomeError, class: ErrorInvalidRequest},
		{req: Request{Key: "5.6.7.8", Cost: 2}, err: storeErr, outcome: OutcomeError, class: ErrorStore},
		{req: Request{Key: "5.6.7.8", Cost: 1}, err: fmt.Errorf("pg: %w", context.DeadlineExceeded), outcome: OutcomeError, class: ErrorDeadline},
	}
	for i, s := range steps {
		pl.err = s.err
		d, err := l.Allow(ctx, s.req)
		// The wrapper returns exactly what the limiter returned.
		switch {
		case s.err != nil && err != s.err:
			t.Fatalf("step %d: Allow error = %v, want the limiter's %v", i, err, s.err)
		case s.class == ErrorInvalidRequest && !errors.Is(err, ErrInvalidRequest):
			t.Fatalf("step %d: Allow error = %v, want ErrInvalidRequest", i, err)
		case s.outcome != OutcomeError && err != nil:
			t.Fatalf("step %d: Allow error = %v", i, err)
		case s.outcome == OutcomeError && err == nil:
			t.Fatalf("step %d: Allow returned no error", i)
		}
		if s.outcome != OutcomeError && (d.Allowed != (s.outcome == OutcomeAllowed) || d.Remaining != s.remain || d.Policy.Name != "api") {
			t.Fatalf("step %d: decision %+v", i, d)
		}
		if !pl.sawSpan {
			t.Fatalf("step %d: limiter did not get the context DecisionStart returned", i)
		}
		e := log.events[i]
		if e.Op != OpAllow || e.Policy != "api" || e.Outcome != s.outcome || e.Cost != s.req.Cost ||
			e.ErrorClass != s.class || e.Remaining != s.remain || e.Duration < 0 {
			t.Fatalf("step %d: event %+v, want outcome %v class %v remaining %d", i, e, s.outcome, s.class, s.remain)
		}
		if (e.Err != nil) != (s.outcome == OutcomeError) || (e.Err != nil && e.Err != err) {
			t.Fatalf("step %d: event error %v, Allow returned %v", i, e.Err, err)
		}
		if s.outcome != OutcomeError && e.Quota != 2 {
			t.Fatalf("step %d: event limit %d, want 2", i, e.Quota)
		}
		if st := log.starts[i]; st != (DecisionStartEvent{Op: OpAllow, Policy: "api", Cost: s.req.Cost}) {
			t.Fatalf("step %d: start event %+v", i, st)
		}
		if !log.ctxOK[i] {
			t.Fatalf("step %d: Decision did not get the context DecisionStart returned", i)
		}
	}
	if len(log.events) != len(steps) || len(log.starts) != len(steps) || len(log.failures) != 0 {
		t.Fatalf("%d events, %d starts, %d failures; want %d, %d, 0", len(log.events), len(log.starts), len(log.failures), len(steps), len(steps))
	}
}

func TestObserveNothingToObserve(t *testing.T) {
	l := newWindowLimiter("p", 1)
	for _, o := range []*Observer{nil, {}, {FailurePolicy: func(context.Context, FailureEvent) {}}} {
		if got := Observe(l, o); got != Limiter(l) {
			t.Errorf("Observe(l, %+v) = %T, want l itself", o, got)
		}
	}
	if got := Observe(nil, &Observer{Decision: func(context.Context, DecisionEvent) {}}); got != nil {
		t.Errorf("Observe(nil, o) = %v, want nil", got)
	}
}

// Capability test limiters: capBase has Allow, and the others add one
// capability each, recording which method ran.
type capBase struct{ calls *[]string }

func (c capBase) Allow(context.Context, Request) (Decision, error) {
	*c.calls = append(*c.calls, "allow")
	return Decision{Allowed: true, Quota: 1, Remaining: 1, Policy: Policy{Name: "cap"}}, nil
}

type capPeek struct{ calls *[]string }

func (c capPeek) Peek(context.Context, Request) (Decision, error) {
	*c.calls = append(*c.calls, "peek")
	return Decision{Quota: 1, Policy: Policy{Name: "cap"}}, nil
}

type capRefund struct{ calls *[]string }

func (c capRefund) Refund(context.Context, Request) (Decision, error) {
	*c.calls = append(*c.calls, "refund")
	return Decision{Allowed: true, Quota: 1, Remaining: 1, Policy: Policy{Name: "cap"}}, nil
}

type capReset struct{ calls *[]string }

func (c capReset) Reset(context.Context, string) error {
	*c.calls = append(*c.calls, "reset")
	return nil
}

func capLimiter(calls *[]string, p, r, s bool) Limiter {
	b, pk, rf, rs := capBase{calls}, capPeek{calls}, capRefund{calls}, capReset{calls}
	switch {
	case p && r && s:
		return struct {
			capBase
			capPeek
			capRefund
			capReset
		}{b, pk, rf, rs}
	case p && r:
		return struct {
			capBase
			capPeek
			capRefund
		}{b, pk, rf}
	case p && s:
		return struct {
			capBase
			capPeek
			capReset
		}{b, pk, rs}
	case r && s:
		return struct {
			capBase
			capRefund
			capReset
		}{b, rf, rs}
	case p:
		return struct {
			capBase
			capPeek
		}{b, pk}
	case r:
		return struct {
			capBase
			capRefund
		}{b, rf}
	case s:
		return struct {
			capBase
			capReset
		}{b, rs}
	}
	return b
}

func TestObservePreservesCapabilities(t *testing.T) {
	ctx := context.Background()
	req := Request{Key: "k", Cost: 1}
	for mask := 0; mask < 8; mask++ {
		p, r, s := mask&1 != 0, mask&2 != 0, mask&4 != 0
		t.Run(fmt.Sprintf("peek=%v,refund=%v,reset=%v", p, r, s), func(t *testing.T) {
			var calls []string
			var log eventLog
			l := Observe(capLimiter(&calls, p, r, s), log.observer())
			want := []string{"allow"}
			wantOps := []Op{OpAllow}
			if _, err := l.Allow(ctx, req); err != nil {
				t.Fatal(err)
			}
			pk, ok := l.(Peeker)
			if ok != p {
				t.Fatalf("wrapped limiter is a Peeker: %v, want %v", ok, p)
			}
			if ok {
				pk.Peek(ctx, req)
				want, wantOps = append(want, "peek"), append(wantOps, OpPeek)
			}
			rf, ok := l.(Refunder)
			if ok != r {
				t.Fatalf("wrapped limiter is a Refunder: %v, want %v", ok, r)
			}
			if ok {
				rf.Refund(ctx, req)
				want, wantOps = append(want, "refund"), append(wantOps, OpRefund)
			}
			rs, ok := l.(Resetter)
			if ok != s {
				t.Fatalf("wrapped limiter is a Resetter: %v, want %v", ok, s)
			}
			if ok {
				if err := rs.Reset(ctx, "k"); err != nil {
					t.Fatal(err)
				}
				want = append(want, "reset") // forwarded, not observed
			}
			if !reflect.DeepEqual(calls, want) {
				t.Fatalf("calls %v, want %v", calls, want)
			}
			var ops []Op
			for _, e := range log.events {
				ops = append(ops, e.Op)
				wantOutcome := OutcomeAllowed
				if e.Op == OpPeek {
					wantOutcome = OutcomeDenied
				}
				if e.Outcome != wantOutcome || e.Policy != "cap" {
					t.Errorf("%v event %+v, want outcome %v policy cap", e.Op, e, wantOutcome)
				}
			}
			if !reflect.DeepEqual(ops, wantOps) {
				t.Fatalf("observed ops %v, want %v", ops, wantOps)
			}
			// A second wrap reports the inner policy name and keeps the
			// capabilities.
			l2 := Observe(l, log.observer())
			if _, ok := l2.(Peeker); ok != p {
				t.Fatalf("double wrap lost Peeker")
			}
		})
	}
}

// TestObserveAddsNoAllocations pins that the wrapper itself allocates
// nothing: an observed Allow allocates as much as a bare one.
func TestObserveAddsNoAllocations(t *testing.T) {
	l := newWindowLimiter("p", 1<<40)
	var n int
	o := Observe(l, &Observer{
		DecisionStart: func(ctx context.Context, e DecisionStartEvent) context.Context { return ctx },
		Decision:      func(ctx context.Context, e DecisionEvent) { n++ },
	})
	ctx := context.Background()
	req := Request{Key: "k", Cost: 1}
	bare := testing.AllocsPerRun(200, func() { l.Allow(ctx, req) })
	wrapped := testing.AllocsPerRun(200, func() { o.Allow(ctx, req) })
	if wrapped != bare {
		t.Fatalf("observed Allow allocates %v times, bare %v", wrapped, bare)
	}
	if n != 201 {
		t.Fatalf("observer saw %d decisions, want 201", n)
	}
}
