//go:build !js

package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/ratekit/ratekit/kvstore"
)

// Take1 is the refill of the fault tests' updates: a bucket of 1000 units
// that refills one unit per microsecond.
var Take1 = kvstore.Refill{Burst: 1000, Rate: 1}

// Slack is how much later than its deadline a call may return on a loaded
// machine, besides the scheduling lateness measured meanwhile (see
// testenv.Lateness).
const Slack = 150 * time.Millisecond

// UpdateWithin runs one take of a unit on key "k" of s with deadline d and
// returns how long it took and its error.
func UpdateWithin(s kvstore.Atomic, d time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	_, err := s.Update(ctx, "k", Take1, kvstore.OpTake, 1)
	return time.Since(start), err
}

// Recovers retries a take on s until it succeeds, for at most 20 seconds,
// and returns how many attempts failed first; it fails t if none succeeds.
// Recovering must happen, not within a time that a busy machine may exceed.
func Recovers(t *testing.T, s kvstore.Atomic) int {
	t.Helper()
	failed := 0
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := UpdateWithin(s, time.Second); err == nil {
			return failed
		}
		failed++
	}
	t.Fatalf("the store did not recover within 20s (%d failed attempts)", failed)
	return failed
}
