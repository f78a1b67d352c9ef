// Package extremes feeds ratekit's constructors extreme numeric values in
// tests: each must return a value or an error matching
// ratekit.ErrInvalidConfig, never panic, and never reserve memory in
// proportion to a number it was given.
package extremes

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

// Ints are the integer values every integer field is fed.
var Ints = []int64{math.MinInt64, math.MinInt32 - 1, math.MinInt32, -1, 0, 1, 2, 255, 256, math.MaxInt32, 1 << 31, 1 << 32, 1<<40 - 1, 1 << 49, 1<<53 + 1, 1 << 62, math.MaxInt64 - 1, math.MaxInt64}

// Durations are the values every duration field is fed.
var Durations = []time.Duration{math.MinInt64, -time.Hour, -time.Nanosecond, 0, time.Nanosecond, time.Microsecond, time.Millisecond, time.Second, 366 * 24 * time.Hour, 1 << 62, math.MaxInt64}

// Floats are the values every float field is fed.
var Floats = []float64{math.Inf(-1), -math.MaxFloat64, -1, -math.SmallestNonzeroFloat64, 0, math.SmallestNonzeroFloat64, 0.5, 1, 1 + 1e-9, 2, math.MaxFloat64, math.Inf(1), math.NaN()}

// MaxAlloc is the most heap a constructor may allocate, in bytes, whatever
// sizes it is given.
const MaxAlloc = 1 << 20

// Check calls construct in a subtest named name and fails it when construct
// panics, allocates more than MaxAlloc bytes, or returns an error that does
// not match ratekit.ErrInvalidConfig. It returns whether construct returned
// no error (false as well when the subtest failed).
func Check(t *testing.T, name string, construct func() error) (ok bool) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		var err error
		var panicked any
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		func() {
			defer func() { panicked = recover() }()
			err = construct()
		}()
		runtime.ReadMemStats(&after)
		if panicked != nil {
			t.Fatalf("panic: %v", panicked)
		}
		if n := after.TotalAlloc - before.TotalAlloc; n > MaxAlloc {
			t.Errorf("allocated %d bytes", n)
		}
		if err != nil && !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Fatalf("error %v does not match ratekit.ErrInvalidConfig", err)
		}
		ok = err == nil && !t.Failed()
	})
	return ok
}

// Name returns a subtest name for field set to v.
func Name(field string, v any) string { return fmt.Sprintf("%s=%v", field, v) }
