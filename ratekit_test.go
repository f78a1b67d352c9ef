package ratekit

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// windowLimiter is a fixed-window counter used to drive the HTTP layer in
// tests. It echoes client state: the new state is the old one plus "+".
type windowLimiter struct {
	mu     sync.Mutex
	policy Policy
	used   map[string]int64
	// resetIn is reported as ResetAfter and, on denials, RetryAfter.
	resetIn time.Duration
	calls   int
}

func newWindowLimiter(name string, quota int64) *windowLimiter {
	return &windowLimiter{
		policy:  Policy{Name: name, Quota: quota, Window: time.Minute},
		used:    map[string]int64{},
		resetIn: 42500 * time.Millisecond,
	}
}

func (l *windowLimiter) Allow(ctx context.Context, req Request) (Decision, error) {
	if err := req.Validate(); err != nil {
		return Decision{}, err
	}
	if req.Cost > l.policy.Quota {
		return Decision{}, ErrCostExceedsQuota
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	d := Decision{Quota: l.policy.Quota, Policy: l.policy, ResetAfter: l.resetIn}
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

func TestRequestValidate(t *testing.T) {
	long := strings.Repeat("k", MaxKeyLen+1)
	tests := []struct {
		name string
		req  Request
		want error
	}{
		{"ok", Request{Key: "k", Cost: 1}, nil},
		{"max key", Request{Key: long[:MaxKeyLen], Cost: 3}, nil},
		{"empty key", Request{Cost: 1}, ErrEmptyKey},
		{"long key", Request{Key: long, Cost: 1}, ErrKeyTooLong},
		{"zero cost", Request{Key: "k"}, ErrInvalidCost},
		{"negative cost", Request{Key: "k", Cost: -1}, ErrInvalidCost},
		{"long idempotency key", Request{Key: "k", Cost: 1, IdempotencyKey: long}, ErrKeyTooLong},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.req.Validate()
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("Validate() = %v, want %v", err, tt.want)
			}
			if err != nil && !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("Validate() = %v, does not match ErrInvalidRequest", err)
			}
		})
	}
	if !errors.Is(ErrCostExceedsQuota, ErrInvalidRequest) {
		t.Fatal("ErrCostExceedsQuota does not match ErrInvalidRequest")
	}
}

func TestValidatePolicyName(t *testing.T) {
	for _, ok := range []string{"contact-form", "a", "tier:pro.v2_daily", strings.Repeat("x", MaxPolicyNameLen)} {
		if err := ValidatePolicyName(ok); err != nil {
			t.Errorf("ValidatePolicyName(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", "with space", `quo"te`, "back\\slash", "ünï", "semi;colon", "comma,", strings.Repeat("x", MaxPolicyNameLen+1)} {
		if err := ValidatePolicyName(bad); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("ValidatePolicyName(%q) = %v, want ErrInvalidConfig", bad, err)
		}
	}
}
