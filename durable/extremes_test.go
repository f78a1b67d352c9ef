package durable_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/internal/extremes"
)

// TestNewExtremes feeds every numeric field of Config extreme values, for
// every algorithm: New returns a limiter or an error matching
// ratekit.ErrInvalidConfig, never panics nor reserves memory for the denied
// cache's size, and a limiter it returns answers Allow, Peek and Refund on
// the test database.
func TestNewExtremes(t *testing.T) {
	s := newStore(t, pgstoretest.PostgresURL(t), 2)
	prefix := pgstoretest.Prefix(t)
	fields := map[string]func(*durable.Config, int64){
		"Policy.Quota":     func(c *durable.Config, v int64) { c.Policy.Quota = v },
		"Policy.Window":    func(c *durable.Config, v int64) { c.Policy.Window = time.Duration(v) },
		"DeniedCacheSize":  func(c *durable.Config, v int64) { c.DeniedCacheSize = int(v) },
		"Policy.Algorithm": func(c *durable.Config, v int64) { c.Policy.Algorithm = ratekit.Algorithm(v) },
		"Durability":       func(c *durable.Config, v int64) { c.Durability = durable.Durability(v) },
	}
	values := append([]int64{}, extremes.Ints...)
	for _, d := range extremes.Durations {
		values = append(values, int64(d))
	}
	type named struct {
		name string
		set  func(*durable.Config)
	}
	var cases []named
	for field, set := range fields {
		for _, v := range values {
			cases = append(cases, named{extremes.Name(field, v), func(c *durable.Config) { set(c, v) }})
		}
	}
	for _, p := range extremes.Floats {
		cases = append(cases, named{extremes.Name("CleanupProbability", p), func(c *durable.Config) { c.CleanupProbability = p }})
	}
	for _, alg := range algorithms {
		for _, c := range cases {
			cfg := durable.Config{
				Store:              s,
				Policy:             ratekit.Policy{Name: "x", Quota: 5, Window: time.Minute, Algorithm: alg},
				Prefix:             prefix,
				CleanupProbability: -1,
				DeniedCacheSize:    16, Durability: durable.Unlogged,
			}
			c.set(&cfg)
			var l *durable.Limiter
			if !extremes.Check(t, fmt.Sprintf("%v/%s", alg, c.name), func() (err error) {
				l, err = durable.New(cfg)
				return err
			}) {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			for _, cost := range []int64{1, cfg.Policy.Quota, math.MaxInt64} {
				req := ratekit.Request{Key: "k", Cost: cost}
				for name, f := range map[string]func(context.Context, ratekit.Request) (ratekit.Decision, error){"Allow": l.Allow, "Peek": l.Peek, "Refund": l.Refund} {
					d, err := f(ctx, req)
					// A cost above the quota is ErrCostExceedsQuota for
					// a take or a peek; a refund of any size succeeds.
					if cost > cfg.Policy.Quota && name != "Refund" {
						if !errors.Is(err, ratekit.ErrCostExceedsQuota) {
							t.Fatalf("%v/%s: %s cost %d: %v, want ErrCostExceedsQuota", alg, c.name, name, cost, err)
						}
						continue
					}
					if err != nil {
						t.Fatalf("%v/%s: %s cost %d: %v", alg, c.name, name, cost, err)
					}
					if d.Remaining < 0 || d.Remaining > d.Quota || d.RetryAfter < 0 || d.ResetAfter < 0 {
						t.Fatalf("%v/%s: %s cost %d: decision out of range: %+v", alg, c.name, name, cost, d)
					}
				}
			}
			if err := l.Reset(ctx, "k"); err != nil {
				t.Fatalf("%v/%s: Reset: %v", alg, c.name, err)
			}
			cancel()
		}
	}
}

// TestTokenBucketRoundingBound: a token bucket whose whole-microsecond
// interval would refill more than 1% slower than its policy says is
// refused; one that the rounding slows less, or not at all, is accepted.
func TestTokenBucketRoundingBound(t *testing.T) {
	s := newStore(t, pgstoretest.PostgresURL(t), 1)
	for _, tc := range []struct {
		quota  int64
		window time.Duration
		ok     bool
	}{
		{7, time.Second, true},                      // 142,858µs: 6 ppm slower
		{1000, time.Second, true},                   // exactly 1ms
		{1 << 20, 1 << 20 * time.Microsecond, true}, // exactly 1µs
		{1000, 999999 * time.Microsecond, true},     // 1000µs: 1 ppm slower
		{1_000_000, time.Millisecond, false},        // 1µs: 1000 times slower
		{1 << 60, time.Millisecond, false},
		{3, 10 * time.Microsecond, false}, // 4µs: 20% slower
		{3000, time.Second, true},         // 334µs: 0.2% slower
		{30000, time.Second, false},       // 34µs: 2% slower
	} {
		_, err := durable.New(durable.Config{Store: s, Prefix: pgstoretest.Prefix(t),
			Policy: ratekit.Policy{Name: "tb", Quota: tc.quota, Window: tc.window, Algorithm: ratekit.TokenBucket}, Durability: durable.Unlogged})
		if tc.ok && err != nil {
			t.Errorf("%d per %v: %v", tc.quota, tc.window, err)
		}
		if !tc.ok && !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("%d per %v: %v, want ErrInvalidConfig", tc.quota, tc.window, err)
		}
	}
}

// TestRefundExtremes refunds ratekit.MaxQuota units and more to every
// algorithm, plain and planned, on an empty and on a used key: a refund
// never fills above the quota, so each succeeds and leaves the whole quota
// remaining, and none reaches SQL's bigint arithmetic with a product it
// cannot hold.
func TestRefundExtremes(t *testing.T) {
	s := newStore(t, pgstoretest.PostgresURL(t), 2)
	prefix := pgstoretest.Prefix(t)
	ctx := context.Background()
	costs := []int64{ratekit.MaxQuota, ratekit.MaxQuota + 1, 1 << 62, math.MaxInt64}
	check := func(t *testing.T, name string, allow, refund func(context.Context, ratekit.Request) (ratekit.Decision, error), quota int64) {
		for _, used := range []bool{false, true} {
			for _, cost := range costs {
				key := fmt.Sprintf("%s-%t-%d", name, used, cost)
				if used {
					if _, err := allow(ctx, ratekit.Request{Key: key, Cost: 3}); err != nil {
						t.Fatalf("%s: Allow: %v", name, err)
					}
				}
				d, err := refund(ctx, ratekit.Request{Key: key, Cost: cost})
				if err != nil {
					t.Errorf("%s: Refund of %d (used %t): %v", name, cost, used, err)
					continue
				}
				if d.Remaining != quota {
					t.Errorf("%s: Refund of %d (used %t): Remaining %d, want %d", name, cost, used, d.Remaining, quota)
				}
			}
		}
	}
	for _, alg := range algorithms {
		for _, quota := range []int64{5, 1 << 40} {
			name := fmt.Sprintf("%v-%d", alg, quota)
			window := max(time.Hour, time.Duration(quota)*time.Millisecond)
			l, err := durable.New(durable.Config{Store: s, Prefix: prefix, CleanupProbability: -1, Durability: durable.Unlogged,
				Policy: ratekit.Policy{Name: "r" + fmt.Sprint(quota), Quota: quota, Window: window, Algorithm: alg}})
			if err != nil {
				t.Fatal(err)
			}
			check(t, name, l.Allow, l.Refund, quota)
		}
	}
	plan := ratekit.Plan{Name: "p", Policies: []ratekit.Policy{
		{Name: "bucket", Quota: 5, Window: time.Hour, Algorithm: ratekit.TokenBucket},
		{Name: "day", Quota: 5, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Day}},
	}}
	p, err := durable.NewPlanned(durable.PlannedConfig{Store: s, Prefix: prefix + "p", Durability: durable.Logged,
		Plan: func(context.Context, string) (ratekit.Plan, error) { return plan, nil }})
	if err != nil {
		t.Fatal(err)
	}
	check(t, "planned", p.Allow, p.Refund, 5)
}

// TestTokenBucketFillTimeMessage: the refusal of a token bucket whose
// rounded refill would fill it later than its window states the fill time
// it would take, even one beyond the longest time.Duration, never a
// negative one.
func TestTokenBucketFillTimeMessage(t *testing.T) {
	s := newStore(t, pgstoretest.PostgresURL(t), 1)
	// Window/Quota is 9.22µs, rounded up to 10µs: the bucket fills in
	// 10 × MaxQuota µs, 2,777,777 hours, beyond the longest Duration.
	_, err := durable.New(durable.Config{Store: s, Prefix: pgstoretest.Prefix(t), Durability: durable.Unlogged,
		Policy: ratekit.Policy{Name: "x", Quota: ratekit.MaxQuota, Window: math.MaxInt64, Algorithm: ratekit.TokenBucket}})
	if !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Fatalf("New: %v, want ErrInvalidConfig", err)
	}
	if want := "fills in 2777777h46m39.99999s instead"; !strings.Contains(err.Error(), want) {
		t.Errorf("New: %v, want it to say %q", err, want)
	}
}
