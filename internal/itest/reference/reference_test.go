// Package reference_test runs tokenbucket (Atomic mode, on memstore) beside
// golang.org/x/time/rate, the reference token bucket, on one fake clock, at
// the extremes of what tokenbucket.New accepts: the smallest and largest
// burst, the shortest and longest time to fill, costs up to the burst. The
// two must decide alike, except where x/time/rate's float tokens round a
// boundary. The clock moves in whole microseconds, ratekit's resolution.
package reference_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/fakeclock"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

func TestMatchesXTimeRate(t *testing.T) {
	year := 365 * 24 * time.Hour
	configs := []struct {
		burst int64
		rate  tokenbucket.Rate
	}{
		{1, tokenbucket.Rate{Tokens: 1, Per: time.Microsecond}},
		{1, tokenbucket.Rate{Tokens: 1, Per: kvstore.MaxValue * time.Microsecond}}, // the longest: 2^52 units of 1 µs
		{20, tokenbucket.PerSecond(5)},
		{20, tokenbucket.Rate{Tokens: 3, Per: 7 * time.Millisecond}},
		{1000, tokenbucket.PerHour(1)},
		{ratekit.MaxQuota, tokenbucket.Rate{Tokens: 1, Per: time.Microsecond}},
		{ratekit.MaxQuota, tokenbucket.Rate{Tokens: 9, Per: time.Microsecond}},
	}
	ctx := context.Background()
	decisions, edges := 0, 0
	for _, c := range configs {
		t.Run(fmt.Sprintf("burst %d, %d per %v", c.burst, c.rate.Tokens, c.rate.Per), func(t *testing.T) {
			start := time.Unix(1_800_000_000, 0)
			clock := fakeclock.New(start)
			store, err := memstore.New(memstore.Config{MaxKeys: 10, Now: clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			l, err := tokenbucket.New(tokenbucket.Config{Name: "ref", Burst: c.burst, RefillRate: c.rate, Mode: tokenbucket.Atomic, Store: store, Now: clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			perSecond := float64(c.rate.Tokens) / c.rate.Per.Seconds()
			ref := rate.NewLimiter(rate.Limit(perSecond), int(c.burst))
			ref.SetLimitAt(start, rate.Limit(perSecond)) // full at start, as a new key is
			rng := rand.New(rand.NewPCG(uint64(c.burst), uint64(c.rate.Per)))
			// Steps of about the time one unit, or a tenth of the
			// burst, takes to come back.
			unit := time.Duration(float64(time.Second) / perSecond)
			for i := range 3000 {
				// The runs stay within a century: memstore's clock is
				// int64 nanoseconds, which end in 2262.
				span := min(float64(unit)*float64(max(c.burst/10, 1)), float64(100*year/3000*2))
				// Whole microseconds, ratekit's resolution, so that the
				// two see the same elapsed time.
				step := time.Duration(rng.Int64N(int64(max(span, 2000)) / 2)).Truncate(time.Microsecond)
				if rng.IntN(10) == 0 {
					step = 0
				}
				clock.Add(step)
				now := clock.Now()
				n := 1 + rng.Int64N(c.burst)
				if rng.IntN(4) == 0 {
					n = c.burst // a cost equal to the burst
				}
				tokens := ref.TokensAt(now)
				want := ref.AllowN(now, int(n))
				d, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: n})
				if err != nil {
					t.Fatal(err)
				}
				decisions++
				if d.Allowed == want {
					continue
				}
				// x/time/rate counts float tokens: on a boundary, its
				// rounding may tip the decision.
				if tol := 1e-12*float64(c.burst) + 1e-9; math.Abs(tokens-float64(n)) <= tol {
					edges++
					continue
				}
				t.Fatalf("step %d at +%v: cost %d, x/time/rate had %.6f tokens and said %v, ratekit said %v (remaining %d)",
					i, now.Sub(start), n, tokens, want, d.Allowed, d.Remaining)
			}
		})
	}
	t.Logf("%d decisions beside x/time/rate, %d of them on a boundary that float rounding tips", decisions, edges)
}
