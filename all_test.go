package ratekit_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/fakeclock"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/signedwindow"
	"github.com/ratekit/ratekit/tokenbucket"
)

// counter is a window counter in memory whose Allow can be made to fail.
type counter struct {
	mu      sync.Mutex
	policy  ratekit.Policy
	used    map[string]int64
	fail    error
	refunds []context.Context // contexts Refund was called with
}

func newCounter(name string, quota int64) *counter {
	return &counter{policy: ratekit.Policy{Name: name, Quota: quota, Window: time.Minute}, used: map[string]int64{}}
}

func (c *counter) decision(key string, allowed bool) ratekit.Decision {
	d := ratekit.Decision{Allowed: allowed, Quota: c.policy.Quota, Remaining: c.policy.Quota - c.used[key], ResetAfter: time.Minute, Policy: c.policy}
	if !allowed {
		d.RetryAfter = time.Minute
	}
	return d
}

func (c *counter) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail != nil {
		return ratekit.Decision{}, c.fail
	}
	if c.used[req.Key]+req.Cost > c.policy.Quota {
		return c.decision(req.Key, false), nil
	}
	c.used[req.Key] += req.Cost
	return c.decision(req.Key, true), nil
}

func (c *counter) Refund(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refunds = append(c.refunds, ctx)
	if err := ctx.Err(); err != nil {
		return ratekit.Decision{}, err
	}
	c.used[req.Key] = max(c.used[req.Key]-req.Cost, 0)
	return c.decision(req.Key, true), nil
}

// allowOnly is a Limiter with no optional capability.
type allowOnly struct{ ratekit.Limiter }

func TestAllConfig(t *testing.T) {
	a, b := newCounter("a", 3), newCounter("b", 3)
	for name, ls := range map[string][]ratekit.Limiter{
		"none":                     nil,
		"a nil limiter":            {a, nil},
		"a first non-Refunder":     {allowOnly{a}, b},
		"a non-Refunder in middle": {a, allowOnly{b}, newCounter("c", 1)},
	} {
		if l, err := ratekit.All(ls...); !errors.Is(err, ratekit.ErrInvalidConfig) || l != nil {
			t.Errorf("%s: All = %v, %v; want ErrInvalidConfig", name, l, err)
		}
	}
	l, err := ratekit.All(a, allowOnly{b})
	if err != nil {
		t.Fatalf("a non-Refunder last: %v", err)
	}
	for name, ok := range map[string]bool{"Peeker": is[ratekit.Peeker](l), "Refunder": is[ratekit.Refunder](l), "Resetter": is[ratekit.Resetter](l)} {
		if ok {
			t.Errorf("All(counter, allow-only) is a %s; a part is not", name)
		}
	}
	l, err = ratekit.All(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if !is[ratekit.Refunder](l) || is[ratekit.Peeker](l) || is[ratekit.Resetter](l) {
		t.Errorf("All of two Refunders (no Peek, no Reset): %T", l)
	}
}

func is[T any](l ratekit.Limiter) bool { _, ok := l.(T); return ok }

// TestAllErrorRefunds: when a later limiter fails, what earlier ones took
// is given back, even when the caller's context has ended.
func TestAllErrorRefunds(t *testing.T) {
	a, b := newCounter("a", 3), newCounter("b", 3)
	l, err := ratekit.All(a, b)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("store down")
	b.fail = boom
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: 2}); !errors.Is(err, boom) {
		t.Fatalf("Allow = %v, want the second limiter's error", err)
	}
	if a.used["k"] != 0 || len(a.refunds) != 1 {
		t.Fatalf("after a failure of the second limiter, the first has %d used and %d refunds; want 0 and 1", a.used["k"], len(a.refunds))
	}
	if _, ok := a.refunds[0].Deadline(); !ok {
		t.Error("the rollback refund ran without a deadline")
	}
	b.fail = nil
	d, err := l.Allow(context.Background(), ratekit.Request{Key: "k", Cost: 3})
	if err != nil || !d.Allowed {
		t.Fatalf("after the failure: %+v, %v; want the full quota", d, err)
	}
}

// TestAllRefundFailure: a rollback that fails is reported with the cause.
func TestAllRefundFailure(t *testing.T) {
	a, b := newCounter("a", 3), newCounter("b", 1)
	l, _ := ratekit.All(a, b)
	if _, err := l.Allow(context.Background(), ratekit.Request{Key: "k", Cost: 1}); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("refund lost")
	failing := &failingRefunder{counter: a, err: boom}
	l, _ = ratekit.All(failing, b)
	_, err := l.Allow(context.Background(), ratekit.Request{Key: "k", Cost: 1})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "keeps 1 units") {
		t.Fatalf("Allow with a failing rollback = %v, want the refund's error", err)
	}
}

type failingRefunder struct {
	*counter
	err error
}

func (f *failingRefunder) Refund(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return ratekit.Decision{}, f.err
}

func signed(t *testing.T, name string, quota int64, secret byte, now func() time.Time) *signedwindow.Limiter {
	t.Helper()
	l, err := signedwindow.New(signedwindow.Config{
		Name: name, Quota: quota, Window: time.Minute, Now: now,
		Keys: []signedwindow.Key{{ID: 1, Secret: bytes.Repeat([]byte{secret}, signedwindow.MinSecretLen)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestAllClientState: one signedwindow part's token travels in the
// composite's State, and a denial by the other part gives the token its
// units back.
func TestAllClientState(t *testing.T) {
	clock := fakeclock.New(time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC))
	store, err := memstore.New(memstore.Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	tb, err := tokenbucket.New(tokenbucket.Config{
		Name: "org", Burst: 3, RefillRate: tokenbucket.Rate{Tokens: 3, Per: time.Hour}, Mode: tokenbucket.Atomic, Store: store, Now: clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	l, err := ratekit.All(signed(t, "client", 5, 1, clock.Now), tb)
	if err != nil {
		t.Fatal(err)
	}
	state := ""
	ctx := context.Background()
	for i, want := range []bool{true, true, true, false, false} {
		d, err := l.Allow(ctx, ratekit.Request{Key: "ip", Cost: 1, State: state})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != want || d.State == "" || len(d.Parts) != 2 || d.Parts[0].State != "" {
			t.Fatalf("request %d: %+v, want Allowed %v with the token in State only", i+1, d, want)
		}
		state = d.State
	}
	// The denials by the organisation's bucket gave the token back its
	// units: it has used 3 of 5.
	d, err := l.(ratekit.Peeker).Peek(ctx, ratekit.Request{Key: "ip", Cost: 1, State: state})
	if err != nil || d.Parts[0].Remaining != 2 || d.Parts[1].Remaining != 0 {
		t.Fatalf("Peek = %+v, %v; want 2 left in the token, 0 in the bucket", d, err)
	}

	two, err := ratekit.All(signed(t, "a", 5, 2, clock.Now), signed(t, "b", 5, 3, clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := two.Allow(ctx, ratekit.Request{Key: "ip", Cost: 1}); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Fatalf("All of two signed windows: Allow = %v, want ErrInvalidConfig", err)
	}
}
