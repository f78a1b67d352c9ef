package tokenbucket

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

// TestDivisorExact checks divisor.quo against the processor's division at
// the ends of its range, around multiples of the divisor and at random.
func TestDivisorExact(t *testing.T) {
	const maxN = 1 << 53
	rng := rand.New(rand.NewPCG(3, 4))
	divisors := []int64{1, 2, 3, 5, 7, 18, 1000, 1e6, 3_600_000_000, 1<<52 - 1, 1 << 52}
	for range 200 {
		divisors = append(divisors, 1+rng.Int64N(1<<52), 1+rng.Int64N(1<<20))
	}
	for _, d := range divisors {
		v := newDivisor(d)
		ns := []int64{0, 1, d - 1, d, d + 1, maxN - 1, maxN}
		for _, k := range []int64{2, 3, maxN/d - 1, maxN / d} {
			ns = append(ns, k*d-1, k*d, k*d+1)
		}
		for range 200 {
			ns = append(ns, rng.Int64N(maxN+1))
		}
		for _, n := range ns {
			if n < 0 || n > maxN {
				continue
			}
			if got, want := v.quo(n), n/d; got != want {
				t.Fatalf("%d / %d = %d, want %d", n, d, got, want)
			}
		}
	}
}

// TestWaitMatchesTimeUntil checks the Limiter's wait against stepWait over
// kvstore.Refill.TimeUntil for buckets from one unit per microsecond to
// 2^52 units, on a microsecond and a millisecond clock, and so does
// decide's ResetAfter, allowed or denied.
func TestWaitMatchesTimeUntil(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	rates := []Rate{PerSecond(1), PerSecond(7), PerHour(1_000_000_000), {Tokens: 1, Per: 100 * time.Millisecond}, {Tokens: 3, Per: 7 * time.Microsecond}}
	for _, burst := range []int64{1, 20, 1 << 30} {
		for _, r := range rates {
			refill, unit, problem := bucketRefill(burst, r)
			if problem != "" {
				continue
			}
			for _, step := range []time.Duration{0, time.Millisecond} {
				l := &Limiter{refill: refill, unit: unit, step: step, perUnit: newDivisor(unit), perRate: newDivisor(refill.Rate), perMicro: refill.Rate == 1 && step == 0}
				levels := []int64{-1, 0, 1, refill.Burst - 1, refill.Burst}
				for range 100 {
					levels = append(levels, rng.Int64N(refill.Burst+1))
				}
				for _, level := range levels {
					for _, target := range []int64{1, unit, refill.Burst, 1 + rng.Int64N(refill.Burst)} {
						if got, want := l.wait(level, target), stepWait(refill, step, level, target); got != want {
							t.Fatalf("%+v step %v: wait(%d, %d) = %v, want %v", refill, step, level, target, got, want)
						}
					}
					for _, allowed := range []bool{true, false} {
						var d ratekit.Decision
						l.decide(&d, allowed, level, unit)
						if want := stepWait(refill, step, level, refill.Burst); d.ResetAfter != want {
							t.Fatalf("%+v step %v: decide(allowed %v, level %d) ResetAfter %v, want %v", refill, step, allowed, level, d.ResetAfter, want)
						}
					}
					if got, want := l.perUnit.quo(max(level, 0)), max(level, 0)/unit; got != want {
						t.Fatalf("%+v: level %d in tokens = %d, want %d", refill, level, got, want)
					}
				}
			}
		}
	}
}
