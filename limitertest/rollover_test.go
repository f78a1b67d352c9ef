package limitertest_test

import (
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/fakeclock"
	"github.com/ratekit/ratekit/limitertest"
)

// TestChecksWaitOutRollover: a check of a window limiter on a real clock
// (Advance nil) that starts just before its windows roll over (windows
// start at multiples of their length since the Unix epoch, so the checks'
// windows of an hour and two roll over together on the hour) must not see
// them roll mid-check: its counts would start afresh and a correct limiter
// would fail. Here the limiter's clock is the checks' wall clock, 10 ms
// before the hour, and ticks 5 ms at every reading, as a real one moves
// while a store answers.
func TestChecksWaitOutRollover(t *testing.T) {
	start := time.Date(2026, 11, 30, 19, 0, 0, 0, time.UTC).Add(-10 * time.Millisecond)
	ticking := func(clock *fakeclock.Clock) func() time.Time {
		return func() time.Time {
			clock.Add(5 * time.Millisecond)
			return clock.Now()
		}
	}
	t.Run("Peek", func(t *testing.T) {
		clock := fakeclock.New(start)
		limitertest.SetWallClock(t, clock.Now, clock.Add)
		h := limitertest.Harness{
			New: func(t testing.TB, cfg limitertest.Config) ratekit.Limiter {
				return &fixed{cfg: cfg, now: ticking(clock), state: map[string]*window{}}
			},
			Algorithm: ratekit.FixedWindow,
		}
		for _, c := range limitertest.Checks() {
			if c.Name == "Peek" {
				if err := c.Check(t, h); err != nil {
					t.Error(err)
				}
			}
		}
	})
	t.Run("composite", func(t *testing.T) {
		clock := fakeclock.New(start)
		limitertest.SetWallClock(t, clock.Now, clock.Add)
		h := limitertest.CompositeHarness{
			New: func(t testing.TB, policies []limitertest.Config) ratekit.Limiter {
				parts := make([]ratekit.Limiter, len(policies))
				for i, cfg := range policies {
					parts[i] = &fixed{cfg: cfg, now: ticking(clock), state: map[string]*window{}}
				}
				all, err := ratekit.All(parts...)
				if err != nil {
					t.Fatal(err)
				}
				return all
			},
			Algorithm: ratekit.FixedWindow,
		}
		for _, c := range limitertest.CompositeChecks() {
			if err := c.Check(t, h); err != nil {
				t.Errorf("%s: %v", c.Name, err)
			}
		}
	})
}
