package tokenbucket_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/extremes"
	"github.com/ratekit/ratekit/internal/plannedtest"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// TestNewExtremes feeds every numeric field of Config extreme values: New
// returns a limiter or an error matching ratekit.ErrInvalidConfig, never
// panics nor reserves memory for a size, and a limiter it returns answers
// with decisions in range.
func TestNewExtremes(t *testing.T) {
	valid := func(store *memstore.Store, now func() time.Time) tokenbucket.Config {
		return tokenbucket.Config{Name: "x", Burst: 10, RefillRate: tokenbucket.PerSecond(1), Mode: tokenbucket.Atomic, Store: store, Now: now}
	}
	fields := map[string]func(*tokenbucket.Config, int64){
		"Burst":             func(c *tokenbucket.Config, v int64) { c.Burst = v },
		"RefillRate.Tokens": func(c *tokenbucket.Config, v int64) { c.RefillRate.Tokens = v },
		"RefillRate.Per":    func(c *tokenbucket.Config, v int64) { c.RefillRate.Per = time.Duration(v) },
		"Mode":              func(c *tokenbucket.Config, v int64) { c.Mode = tokenbucket.Mode(v) },
		"DeniedCacheSize":   func(c *tokenbucket.Config, v int64) { c.DeniedCacheSize = int(v) },
		"Burst=Tokens":      func(c *tokenbucket.Config, v int64) { c.Burst, c.RefillRate.Tokens = v, v },
		"Tokens=Per": func(c *tokenbucket.Config, v int64) {
			c.RefillRate = tokenbucket.Rate{Tokens: v, Per: time.Duration(v)}
		},
	}
	values := append([]int64{}, extremes.Ints...)
	for _, d := range extremes.Durations {
		values = append(values, int64(d))
	}
	for field, set := range fields {
		for _, v := range values {
			for _, mode := range []tokenbucket.Mode{tokenbucket.Eventual, tokenbucket.Atomic} {
				clock := newClock()
				cfg := valid(memStore(t, clock.Now), clock.Now)
				cfg.Mode = mode
				set(&cfg, v)
				var l *tokenbucket.Limiter
				if !extremes.Check(t, extremes.Name(field, v)+"/"+mode.String(), func() (err error) {
					l, err = tokenbucket.New(cfg)
					return err
				}) {
					continue
				}
				exercise(t, l, clock)
			}
		}
	}
}

func exercise(t *testing.T, l *tokenbucket.Limiter, clock *clock) {
	t.Helper()
	ctx := context.Background()
	limit := l.Policy().Quota
	for _, cost := range []int64{1, 2, limit, math.MaxInt64} {
		req := ratekit.Request{Key: "k", Cost: cost}
		for name, f := range map[string]func(context.Context, ratekit.Request) (ratekit.Decision, error){"Allow": l.Allow, "Peek": l.Peek, "Refund": l.Refund} {
			d, err := f(ctx, req)
			// A cost above the limit is ErrCostExceedsQuota, for a
			// refund too (Limiter.Refund returns Allow's errors).
			if cost > limit {
				if !errors.Is(err, ratekit.ErrCostExceedsQuota) {
					t.Fatalf("%v: %s cost %d: %v, want ErrCostExceedsQuota", l.Policy(), name, cost, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%v: %s cost %d: %v", l.Policy(), name, cost, err)
			}
			if d.Remaining < 0 || d.Remaining > d.Quota || d.RetryAfter < 0 || d.ResetAfter < 0 {
				t.Fatalf("%v: %s cost %d: decision out of range: %+v", l.Policy(), name, cost, d)
			}
		}
		clock.Add(time.Hour)
	}
}

// TestPlannedExtremes runs plannedtest.CheckExtremes on memstore.
func TestPlannedExtremes(t *testing.T) {
	plannedtest.CheckExtremes(t, memStore(t, nil))
}
