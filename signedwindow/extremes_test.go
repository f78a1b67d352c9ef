package signedwindow

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

// extremeInts are the integer values every numeric Config field is fed.
var extremeInts = []int64{math.MinInt64, math.MinInt32, -1, 0, 1, 2, 31, 32, 33, 255, 256, 1 << 31, 1<<40 - 1, 1 << 49, 1 << 62, math.MaxInt32, math.MaxInt64 - 1, math.MaxInt64}

// extremeDurations are the durations every duration field is fed.
var extremeDurations = []time.Duration{math.MinInt64, -time.Hour, -time.Nanosecond, 0, time.Nanosecond, time.Millisecond, time.Second, time.Second + 1, MaxWindow, MaxWindow + time.Second, 1 << 62, math.MaxInt64}

// TestNewExtremes feeds every integer and duration field of Config extreme
// values: New must return a limiter or an error matching
// ratekit.ErrInvalidConfig, never panic, and never reserve memory in
// proportion to a size it was given. A limiter it returns must answer every
// method without panicking.
func TestNewExtremes(t *testing.T) {
	type setter struct {
		field string
		set   func(*Config, int64)
	}
	setters := []setter{
		{"Limit", func(c *Config, v int64) { c.Quota = v }},
		{"Window", func(c *Config, v int64) { c.Window = time.Duration(v) }},
		{"MaxSkew", func(c *Config, v int64) { c.MaxSkew = time.Duration(v) }},
		{"ReplayCacheSize", func(c *Config, v int64) { c.ReplayCacheSize = int(v) }},
		{"NonceLifetime", func(c *Config, v int64) { c.NonceLifetime = time.Duration(v) }},
		{"ChallengeLifetime", func(c *Config, v int64) { c.ChallengeLifetime = time.Duration(v) }},
		{"Difficulty.Base", func(c *Config, v int64) { c.Difficulty = &DifficultyPolicy{Base: int(v), Free: 2, Step: 2, Max: 24} }},
		{"Difficulty.Free", func(c *Config, v int64) { c.Difficulty = &DifficultyPolicy{Base: 16, Free: v, Step: 2, Max: 24} }},
		{"Difficulty.Step", func(c *Config, v int64) { c.Difficulty = &DifficultyPolicy{Base: 16, Free: 2, Step: int(v), Max: 24} }},
		{"Difficulty.Max", func(c *Config, v int64) { c.Difficulty = &DifficultyPolicy{Base: 0, Free: 2, Step: 2, Max: int(v)} }},
		{"Keys[0].ID", func(c *Config, v int64) { c.Keys = []Key{{ID: uint8(v), Secret: secret(1)}} }},
	}
	values := append([]int64{}, extremeInts...)
	for _, d := range extremeDurations {
		values = append(values, int64(d))
	}
	for _, s := range setters {
		for _, v := range values {
			t.Run(fmt.Sprintf("%s=%d", s.field, v), func(t *testing.T) {
				clock := newClock(t0)
				cfg := testConfig(clock)
				s.set(&cfg, v)
				var l *Limiter
				var err error
				allocated := allocatedBytes(func() { l, err = New(cfg) })
				if allocated > 1<<20 {
					t.Errorf("New allocated %d bytes", allocated)
				}
				if err != nil {
					if !errors.Is(err, ratekit.ErrInvalidConfig) {
						t.Fatalf("New: %v, want an error matching ErrInvalidConfig", err)
					}
					return
				}
				exercise(t, l, clock)
			})
		}
	}
}

// allocatedBytes returns the bytes allocated on the heap while f runs.
func allocatedBytes(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// exercise calls every method of l with ordinary and extreme arguments,
// across a window's end.
func exercise(t *testing.T, l *Limiter, clock *fakeClock) {
	t.Helper()
	ctx := context.Background()
	state := ""
	for _, cost := range []int64{math.MinInt64, -1, 0, 1, 2, math.MaxInt64} {
		req := ratekit.Request{Key: alice, Cost: cost, State: state}
		for _, f := range []func(context.Context, ratekit.Request) (ratekit.Decision, error){l.Allow, l.Peek, l.Refund} {
			d, err := f(ctx, req)
			if err == nil {
				if d.Remaining < 0 || d.Remaining > d.Quota || d.ResetAfter < 0 || d.RetryAfter < 0 {
					t.Fatalf("cost %d: decision out of range: %+v", cost, d)
				}
				state = d.State
			} else if cost >= 1 && cost <= l.limit {
				t.Fatalf("cost %d: %v", cost, err)
			}
		}
	}
	for _, used := range extremeInts {
		if b := l.Difficulty(used); b < 0 || b > MaxDifficulty {
			t.Fatalf("Difficulty(%d) = %d", used, b)
		}
	}
	if _, err := l.NewNonce(alice); err != nil {
		t.Fatalf("NewNonce: %v", err)
	}
	for _, bits := range []int{math.MinInt, -1, 0, MaxDifficulty + 1, math.MaxInt} {
		if _, err := l.NewChallenge(alice, bits); (err == nil) != (bits == 0) {
			t.Fatalf("NewChallenge(%d): %v", bits, err)
		}
		_ = l.VerifySolution("x.1", alice, bits)
	}
	clock.Add(l.window)
	if _, err := l.Allow(ctx, ratekit.Request{Key: alice, Cost: 1, State: state}); err != nil {
		t.Fatalf("Allow after the window: %v", err)
	}
}

// TestDifficultyBitsExtremes checks DifficultyPolicy.Bits over extreme
// counts and policies: the answer is always from Base to Max.
func TestDifficultyBitsExtremes(t *testing.T) {
	for _, step := range []int{0, 1, 2, 31, 32, 33, 1 << 31, math.MaxInt} {
		for _, free := range []int64{0, 1, 1 << 40, math.MaxInt64} {
			p := DifficultyPolicy{Base: 3, Free: free, Step: step, Max: 20}
			if err := p.validate(); err != nil {
				t.Fatalf("%+v: %v", p, err)
			}
			for _, used := range extremeInts {
				b := p.Bits(used)
				if b < p.Base || b > p.Max {
					t.Fatalf("%+v.Bits(%d) = %d, outside %d to %d", p, used, b, p.Base, p.Max)
				}
				if used >= free && step > 0 && used-free >= int64(p.Max) && b != p.Max {
					t.Fatalf("%+v.Bits(%d) = %d, want Max", p, used, b)
				}
			}
		}
	}
}
