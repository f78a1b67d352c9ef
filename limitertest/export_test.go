package limitertest

import (
	"testing"
	"time"
)

// SetWallClock makes now and sleep the clock that the checks of a limiter
// on a real clock read and wait on, until t ends.
func SetWallClock(t testing.TB, now func() time.Time, sleep func(time.Duration)) {
	oldNow, oldSleep := wallNow, wallSleep
	wallNow, wallSleep = now, sleep
	t.Cleanup(func() { wallNow, wallSleep = oldNow, oldSleep })
}
