package signedwindow

import (
	"bytes"
	"github.com/ratekit/ratekit/internal/fakeclock"
	"testing"
	"time"
)

// t0 is the fake clock's start: a time with a sub-second part, so that
// tests see the rounding of window starts to whole seconds.
var t0 = time.Date(2026, 11, 22, 12, 0, 0, 250_000_000, time.UTC)

// fakeClock is the shared fake clock.
type fakeClock = fakeclock.Clock

func newClock(t time.Time) *fakeClock { return fakeclock.New(t) }

// secret returns a valid 32-byte test secret filled with b.
func secret(b byte) []byte { return bytes.Repeat([]byte{b}, MinSecretLen) }

// testConfig is a valid configuration on clock: 3 units per minute.
func testConfig(clock *fakeClock) Config {
	return Config{
		Name:   "contact-form",
		Quota:  3,
		Window: time.Minute,
		Keys:   []Key{{ID: 1, Secret: secret(1)}},
		Now:    clock.Now,
	}
}

func mustNew(tb testing.TB, cfg Config) *Limiter {
	tb.Helper()
	l, err := New(cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return l
}
