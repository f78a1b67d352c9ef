package tokenbucket_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/fakeclock"
	"github.com/ratekit/ratekit/internal/plannedtest"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

func newPlanned(t testing.TB, store kvstore.Store, now func() time.Time, plan func(context.Context, string) (ratekit.Plan, error)) *tokenbucket.Planned {
	t.Helper()
	p, err := tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Prefix: "api", Store: store, Plan: plan, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPlannedCalendar runs the calendar scenarios on memstore, whose
// clock is the fake clock the periods are computed from: exact to the
// microsecond.
func TestPlannedCalendar(t *testing.T) {
	plannedtest.Run(t, 0, func(t *testing.T, c *fakeclock.Clock, plan func(context.Context, string) (ratekit.Plan, error)) plannedtest.Limiter {
		return newPlanned(t, memStore(t, c.Now), c.Now, plan)
	})
}

// TestPlannedPeriodBoundary: memstore decides on its own clock, to the
// microsecond: the last microsecond of a month counts in it, the next one
// in the next month.
func TestPlannedPeriodBoundary(t *testing.T) {
	end := time.Date(2027, time.March, 1, 0, 0, 0, 0, time.UTC)
	c := fakeclock.New(end.Add(-time.Microsecond))
	plans := &plannedtest.Plans{}
	plans.Set("k", ratekit.Plan{Policies: []ratekit.Policy{{Name: "m", Quota: 1, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Month}}}})
	l := newPlanned(t, memStore(t, c.Now), c.Now, plans.Plan)
	ctx := context.Background()
	if d, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: 1}); err != nil || !d.Allowed || d.ResetAfter != time.Microsecond {
		t.Fatalf("last microsecond of February: %+v, %v", d, err)
	}
	c.Add(time.Microsecond)
	if d, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: 1}); err != nil || !d.Allowed || d.ResetAfter != 31*24*time.Hour {
		t.Fatalf("first microsecond of March: %+v, %v", d, err)
	}
}

// TestPlannedStoreClock: the period is the one the store's clock is in,
// not this process's; a process clock more than a period away fails with
// ErrClockSkew and changes nothing.
func TestPlannedStoreClock(t *testing.T) {
	store := fakeclock.New(time.Date(2027, time.May, 31, 23, 59, 0, 0, time.UTC))
	process := fakeclock.New(time.Date(2027, time.June, 1, 0, 1, 0, 0, time.UTC))
	plans := &plannedtest.Plans{}
	plans.Set("k", ratekit.Plan{Policies: []ratekit.Policy{{Name: "m", Quota: 1, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Month}}}})
	l := newPlanned(t, memStore(t, store.Now), process.Now, plans.Plan)
	ctx := context.Background()
	d, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: 1})
	if err != nil || !d.Allowed || d.ResetAfter != time.Minute || d.Policy.Window != 31*24*time.Hour {
		t.Fatalf("allow in May by the store's clock: %+v, %v", d, err)
	}
	process.Add(62 * 24 * time.Hour)
	if _, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: 1}); !errors.Is(err, ratekit.ErrClockSkew) {
		t.Fatalf("process clock two months ahead: err = %v, want ErrClockSkew", err)
	}
	process.Add(-62 * 24 * time.Hour)
	if d, err := l.Peek(ctx, ratekit.Request{Key: "k", Cost: 1}); err != nil || d.Allowed {
		t.Fatalf("after the skewed call: %+v, %v; want May's count kept", d, err)
	}
}

// TestPlannedErrors: plan errors and invalid plans are errors, never a
// panic, and decide nothing.
func TestPlannedErrors(t *testing.T) {
	c := newClock()
	boom := errors.New("plan store down")
	plans := map[string]ratekit.Plan{
		"empty":   {},
		"sliding": {Name: "s", Policies: []ratekit.Policy{{Name: "s", Quota: 5, Window: time.Minute, Algorithm: ratekit.SlidingWindow}}},
		"log":     {Name: "l", Policies: []ratekit.Policy{{Name: "l", Quota: 5, Window: time.Minute, Algorithm: ratekit.SlidingLog}}},
		"nanos":   {Name: "n", Policies: []ratekit.Policy{{Name: "b", Quota: 5, Window: time.Nanosecond, Algorithm: ratekit.TokenBucket}}},
		"huge":    {Name: "h", Policies: []ratekit.Policy{{Name: "b", Quota: ratekit.MaxQuota, Window: 1000 * time.Hour, Algorithm: ratekit.TokenBucket}}},
		"window":  {Name: "w", Policies: []ratekit.Policy{{Name: "w", Quota: 5, Window: 1500 * time.Nanosecond, Algorithm: ratekit.FixedWindow}}},
		"twice":   {Name: "t", Policies: []ratekit.Policy{{Name: "a", Quota: 5, Window: time.Second, Algorithm: ratekit.TokenBucket}, {Name: "a", Quota: 5, Window: time.Second, Algorithm: ratekit.TokenBucket}}},
		"period":  {Name: "p", Policies: []ratekit.Policy{{Name: "p", Quota: 5, Algorithm: ratekit.TokenBucket, Period: ratekit.Period{Unit: ratekit.Day}}}},
		"ok":      {Name: "ok", Policies: []ratekit.Policy{{Name: "a", Quota: 5, Window: time.Second, Algorithm: ratekit.TokenBucket}, {Name: "d", Quota: 5, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Day}}}},
	}
	l := newPlanned(t, memStore(t, c.Now), c.Now, func(_ context.Context, key string) (ratekit.Plan, error) {
		if key == "down" {
			return ratekit.Plan{}, boom
		}
		return plans[key], nil
	})
	ctx := context.Background()
	if _, err := l.Allow(ctx, ratekit.Request{Key: "down", Cost: 1}); !errors.Is(err, boom) {
		t.Errorf("plan func error: %v, want it wrapped", err)
	}
	for _, key := range []string{"empty", "sliding", "log", "nanos", "huge", "window", "twice", "period"} {
		_, err := l.Allow(ctx, ratekit.Request{Key: key, Cost: 1})
		if !errors.Is(err, ratekit.ErrInvalidConfig) || !strings.HasPrefix(err.Error(), "tokenbucket: ") {
			t.Errorf("plan %q: err = %v, want a tokenbucket: error matching ErrInvalidConfig", key, err)
		}
		if _, err := l.Usage(ctx, key); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("usage of plan %q: err = %v, want ErrInvalidConfig", key, err)
		}
	}
	for name, tc := range map[string]struct {
		req  ratekit.Request
		want error
	}{
		"no key":           {ratekit.Request{Cost: 1}, ratekit.ErrEmptyKey},
		"zero cost":        {ratekit.Request{Key: "ok"}, ratekit.ErrInvalidCost},
		"cost above quota": {ratekit.Request{Key: "ok", Cost: 6}, ratekit.ErrCostExceedsQuota},
		"parts":            {ratekit.Request{Key: "ok", Cost: 1, Parts: []ratekit.Part{{Key: "x", Cost: 1}}}, ratekit.ErrInvalidRequest},
	} {
		if _, err := l.Allow(ctx, tc.req); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", name, err, tc.want)
		}
	}
	if u, err := l.Usage(ctx, "ok"); err != nil || u[0].Used != 0 || u[1].Used != 0 {
		t.Errorf("after refused calls, usage %+v, %v; want nothing used", u, err)
	}
	if err := l.Reset(ctx, ""); !errors.Is(err, ratekit.ErrEmptyKey) {
		t.Errorf("Reset(\"\"): %v", err)
	}
	plan := func(context.Context, string) (ratekit.Plan, error) { return plans["ok"], nil }
	for name, cfg := range map[string]tokenbucket.PlannedConfig{
		"no prefix":          {Store: memStore(t, c.Now), Plan: plan},
		"prefix with a /":    {Prefix: "a/b", Store: memStore(t, c.Now), Plan: plan},
		"no plan func":       {Prefix: "p", Store: memStore(t, c.Now)},
		"no store":           {Prefix: "p", Plan: plan},
		"no period counting": {Prefix: "p", Store: struct{ kvstore.Store }{memStore(t, c.Now)}, Plan: plan},
	} {
		if _, err := tokenbucket.NewPlanned(cfg); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", name, err)
		}
	}
}

// TestPlannedUsageResetParts: Usage reads what decisions counted, Reset
// forgets the key under its current plan, and Parts count other keys.
func TestPlannedUsageResetParts(t *testing.T) {
	c := newClock()
	plans := &plannedtest.Plans{}
	plan := ratekit.Plan{Name: "pro", Policies: []ratekit.Policy{
		{Name: "second", Quota: 10, Window: time.Second, Algorithm: ratekit.TokenBucket},
		{Name: "month", Quota: 1000, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Month}},
	}}
	plans.Set("org", plan)
	l := newPlanned(t, memStore(t, c.Now), c.Now, plans.Plan)
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if d, err := l.Allow(ctx, ratekit.Request{Key: "org", Cost: 2}); err != nil || !d.Allowed {
			t.Fatalf("allow %d: %+v, %v", i, d, err)
		}
	}
	d, err := l.Allow(ctx, ratekit.Request{Key: "org", Cost: 5})
	if err != nil || d.Allowed || len(d.Parts) != 2 || d.Parts[0].Allowed || !d.Parts[1].Allowed || d.Parts[0].RetryAfter != time.Second/10 {
		t.Fatalf("a take the bucket refuses: %+v, %v", d, err)
	}
	u, err := l.Usage(ctx, "org")
	if err != nil || u[0].Used != 6 || u[0].Remaining != 4 || u[1].Used != 6 || u[1].Remaining != 994 || u[1].Policy.Window != 30*24*time.Hour {
		t.Fatalf("usage %+v, %v", u, err)
	}
	if u[1].ResetAfter != time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).Sub(c.Now()) {
		t.Fatalf("month resets after %v", u[1].ResetAfter)
	}
	// Parts: the month counts the organisation, the burst a user.
	parts := []ratekit.Part{{Key: "user-1", Cost: 10}, {Key: "org", Cost: 10}}
	if d, err := l.Allow(ctx, ratekit.Request{Key: "org", Cost: 1, Parts: parts}); err != nil || !d.Allowed || d.Parts[0].Remaining != 0 || d.Parts[1].Remaining != 984 {
		t.Fatalf("allow with parts: %+v, %v", d, err)
	}
	if err := l.Reset(ctx, "org"); err != nil {
		t.Fatal(err)
	}
	if u, err := l.Usage(ctx, "org"); err != nil || u[0].Used != 0 || u[1].Used != 0 || u[1].Remaining != 1000 {
		t.Fatalf("usage after Reset: %+v, %v", u, err)
	}
	// The user's bucket is not the key's: Reset left it empty.
	if d, err := l.Peek(ctx, ratekit.Request{Key: "org", Cost: 1, Parts: []ratekit.Part{{Key: "user-1", Cost: 1}, {Key: "org", Cost: 1}}}); err != nil || d.Parts[0].Allowed {
		t.Fatalf("user-1 after the org's reset: %+v, %v", d, err)
	}
}

// TestPlannedConcurrent: 8 goroutines on one key of a monthly quota of 50
// admit exactly 50 costs' worth, and Usage reads back their sum.
func TestPlannedConcurrent(t *testing.T) {
	c := newClock()
	plans := &plannedtest.Plans{}
	plans.Set("k", plannedtest.Monthly("m", 50, time.Time{}, nil))
	l := newPlanned(t, memStore(t, c.Now), c.Now, plans.Plan)
	admitted, used := plannedtest.Race(t, l, "k", 8, 20, 1)
	if admitted != 50 || used != 50 {
		t.Fatalf("admitted %d units, usage reads %d; want 50 and 50", admitted, used)
	}
	plans.Set("v", plannedtest.Monthly("m", 50, time.Time{}, nil))
	admitted, used = plannedtest.Race(t, l, "v", 8, 20, 3)
	if admitted > 50 || admitted < 48 || used != admitted {
		t.Fatalf("costs 1 to 3: admitted %d units, usage reads %d; want 48 to 50, and equal", admitted, used)
	}
}

// TestPlannedShortWindowLatency: a fixed window without a Period takes its
// bounds from this process's clock, and the store reads its own clock a
// round trip later. A window shorter than tokenbucket.MinFixedWindow is
// refused as a configuration error, never decided into a false
// ErrClockSkew; one of MinFixedWindow decides whatever the phase of the
// process's clock in its window, with the store's clock up to a window
// minus a microsecond ahead (latency), or as much behind (skew).
func TestPlannedShortWindowLatency(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2027, time.March, 1, 0, 0, 0, 0, time.UTC)
	for _, w := range []time.Duration{time.Microsecond, time.Millisecond, 10 * time.Millisecond, tokenbucket.MinFixedWindow - time.Microsecond} {
		process := fakeclock.New(start.Add(w - time.Microsecond)) // the window's last microsecond
		store := fakeclock.New(start.Add(w - time.Microsecond + 2*time.Millisecond))
		plans := &plannedtest.Plans{}
		plans.Set("k", ratekit.Plan{Name: "short", Policies: []ratekit.Policy{{Name: "w", Quota: 5, Window: w, Algorithm: ratekit.FixedWindow}}})
		l := newPlanned(t, memStore(t, store.Now), process.Now, plans.Plan)
		_, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: 1})
		if !errors.Is(err, ratekit.ErrInvalidConfig) || !strings.Contains(err.Error(), "MinFixedWindow") {
			t.Errorf("window %v, store clock 2ms ahead: err = %v, want ErrInvalidConfig naming MinFixedWindow", w, err)
		}
	}
	w := tokenbucket.MinFixedWindow
	for _, phase := range []time.Duration{0, time.Microsecond, w / 2, w - time.Microsecond} {
		for _, offset := range []time.Duration{0, time.Millisecond, w - time.Microsecond, -w + time.Microsecond} {
			process := fakeclock.New(start.Add(phase))
			store := fakeclock.New(start.Add(phase + offset))
			plans := &plannedtest.Plans{}
			plans.Set("k", ratekit.Plan{Name: "second", Policies: []ratekit.Policy{{Name: "w", Quota: 5, Window: w, Algorithm: ratekit.FixedWindow}}})
			l := newPlanned(t, memStore(t, store.Now), process.Now, plans.Plan)
			if d, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: 1}); err != nil || !d.Allowed {
				t.Errorf("window %v, process at %v into it, store %v from it: %+v, %v", w, phase, offset, d, err)
			}
		}
	}
}

// steppedStore is a memstore whose clock, it says, advances in whole
// milliseconds, as Redis's does.
type steppedStore struct{ *memstore.Store }

func (steppedStore) ClockStep() time.Duration { return time.Millisecond }

// TestClockStepRefusesFasterBuckets: on a store whose clock advances in
// milliseconds, a bucket that fills from empty in less than a millisecond
// would be full again at every step and admit at most its burst per
// millisecond, less than its rate: New (Atomic), NewComposite and a
// Planned's plan refuse it; one that fills in a millisecond is accepted.
// Eventual mode reads the process's clock and is not affected.
func TestClockStepRefusesFasterBuckets(t *testing.T) {
	store := steppedStore{memStore(t, nil)}
	for _, tc := range []struct {
		burst int64
		rate  tokenbucket.Rate
		ok    bool
	}{
		{5, tokenbucket.Rate{Tokens: 5, Per: 999 * time.Microsecond}, false},
		{1, tokenbucket.Rate{Tokens: 1, Per: 100 * time.Microsecond}, false},
		{10, tokenbucket.Rate{Tokens: 100, Per: time.Millisecond}, false},
		{5, tokenbucket.Rate{Tokens: 5, Per: time.Millisecond}, true},
		{10, tokenbucket.Rate{Tokens: 1, Per: 100 * time.Microsecond}, true},
	} {
		_, err := tokenbucket.New(tokenbucket.Config{Name: "b", Burst: tc.burst, RefillRate: tc.rate, Mode: tokenbucket.Atomic, Store: store})
		if tc.ok != (err == nil) || (err != nil && (!errors.Is(err, ratekit.ErrInvalidConfig) || !strings.Contains(err.Error(), "step of the store's clock"))) {
			t.Errorf("New Atomic, burst %d at %d per %v: %v, want ok %t", tc.burst, tc.rate.Tokens, tc.rate.Per, err, tc.ok)
		}
		if _, err := tokenbucket.New(tokenbucket.Config{Name: "b", Burst: tc.burst, RefillRate: tc.rate, Mode: tokenbucket.Eventual, Store: store}); err != nil {
			t.Errorf("New Eventual, burst %d at %d per %v: %v", tc.burst, tc.rate.Tokens, tc.rate.Per, err)
		}
		_, err = tokenbucket.NewComposite(tokenbucket.CompositeConfig{Mode: tokenbucket.Atomic, Store: store, Buckets: []tokenbucket.Bucket{
			{Name: "slow", Burst: 5, RefillRate: tokenbucket.Rate{Tokens: 5, Per: time.Second}},
			{Name: "b", Burst: tc.burst, RefillRate: tc.rate},
		}})
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ratekit.ErrInvalidConfig)) {
			t.Errorf("NewComposite, burst %d at %d per %v: %v, want ok %t", tc.burst, tc.rate.Tokens, tc.rate.Per, err, tc.ok)
		}
	}
	plans := &plannedtest.Plans{}
	plans.Set("fast", ratekit.Plan{Name: "fast", Policies: []ratekit.Policy{{Name: "b", Quota: 5, Window: 999 * time.Microsecond, Algorithm: ratekit.TokenBucket}}})
	plans.Set("ms", ratekit.Plan{Name: "ms", Policies: []ratekit.Policy{{Name: "b", Quota: 5, Window: time.Millisecond, Algorithm: ratekit.TokenBucket}}})
	l := newPlanned(t, store, nil, plans.Plan)
	ctx := context.Background()
	if _, err := l.Allow(ctx, ratekit.Request{Key: "fast", Cost: 1}); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Errorf("Planned, a bucket filling in 999µs: %v, want ErrInvalidConfig", err)
	}
	if d, err := l.Allow(ctx, ratekit.Request{Key: "ms", Cost: 1}); err != nil || !d.Allowed {
		t.Errorf("Planned, a bucket filling in 1ms: %+v, %v", d, err)
	}
}

// TestPlannedWithoutHistoryOrIdempotency: on a store that keeps no period
// history and no idempotency records (memstore), PeriodUsage fails with
// an error matching errors.ErrUnsupported, after checking its policy
// name, and a repeated IdempotencyKey counts every time, as documented.
func TestPlannedWithoutHistoryOrIdempotency(t *testing.T) {
	c := newClock()
	plans := &plannedtest.Plans{}
	plans.Set("k", plannedtest.Monthly("m", 50, time.Time{}, nil))
	l := newPlanned(t, memStore(t, c.Now), c.Now, plans.Plan)
	ctx := context.Background()
	none := func(ratekit.PeriodUsage) error { t.Fatal("a period reported"); return nil }
	if err := l.PeriodUsage(ctx, "m", c.Now().AddDate(0, -1, 0), c.Now(), none); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("PeriodUsage on memstore: %v, want errors.ErrUnsupported", err)
	}
	if err := l.PeriodUsage(ctx, "m/x", time.Time{}, c.Now(), none); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Fatalf("PeriodUsage of policy \"m/x\": %v, want ratekit.ErrInvalidConfig", err)
	}
	for i := 0; i < 2; i++ {
		if _, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: 3, IdempotencyKey: "charge-1"}); err != nil {
			t.Fatal(err)
		}
	}
	if u, err := l.Usage(ctx, "k"); err != nil || u[0].Used != 6 {
		t.Fatalf("usage after two Allows of one idempotency key on memstore: %+v, %v; want 6 used", u, err)
	}
}
