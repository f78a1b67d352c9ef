// Package fakeclock is a settable clock for ratekit's tests, so that
// in-process time math runs on deterministic time.
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a clock that moves only when told to. It is safe for concurrent
// use; pass its Now method where a config takes a Now func.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// New returns a Clock that reads t until advanced.
func New(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Add moves the clock by d (backwards when d is negative).
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
