package signedwindow

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// t0 is the fake clock's start: a time with a sub-second part, so that
// tests see the rounding of window starts to whole seconds.
var t0 = time.Date(2026, 11, 22, 12, 0, 0, 250_000_000, time.UTC)

// fakeClock is a settable clock, safe for concurrent use.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *fakeClock { return &fakeClock{t: t} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// secret returns a valid 32-byte test secret filled with b.
func secret(b byte) []byte { return bytes.Repeat([]byte{b}, MinSecretLen) }

// testConfig is a valid configuration on clock: 3 units per minute.
func testConfig(clock *fakeClock) Config {
	return Config{
		Name:   "contact-form",
		Limit:  3,
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
