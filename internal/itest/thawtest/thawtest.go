// Package thawtest holds what the stores' thaw tests share: decisions made
// one after another once a relay has silenced the connections of a client
// (as a NAT gateway leaves the flows it dropped while an instance was
// frozen), and their reading.
package thawtest

import (
	"context"
	"testing"
	"time"

	"github.com/ratekit/ratekit/kvstore"
)

// Cost is the cost of one take in the Redis stores' thaw tests: so large
// against Refill's refill (one unit per microsecond) that the record's
// value counts the takes that reached Redis exactly.
const Cost = 1_000_000_000_000

// Refill is the bucket of the Redis stores' thaw tests.
var Refill = kvstore.Refill{Burst: kvstore.MaxValue, Rate: 1}

// Applied returns how many takes of Cost the level of a Refill bucket
// counts.
func Applied(level int64) int64 { return (kvstore.MaxValue - level + Cost/2) / Cost }

// An Attempt is one decision after the thaw.
type Attempt struct {
	Start, End time.Time
	Err        error
}

// Decide calls decide while more, given the attempts so far, says so.
func Decide(decide func() error, more func([]Attempt) bool) []Attempt {
	var log []Attempt
	for more(log) {
		a := Attempt{Start: time.Now()}
		a.Err = decide()
		a.End = time.Now()
		log = append(log, a)
	}
	return log
}

// Count returns a more for Decide that makes n decisions.
func Count(n int) func([]Attempt) bool {
	return func(log []Attempt) bool { return len(log) < n }
}

// Read logs every failed attempt and a summary, and returns how many
// failed and the time from the first attempt's start to the first
// success's end. It fails the test at once when no attempt succeeded.
func Read(t testing.TB, silenced int, log []Attempt) (failed int, recovery time.Duration) {
	t.Helper()
	inARow, firstOK := 0, -1
	for i, a := range log {
		if a.Err != nil {
			failed++
			if firstOK < 0 {
				inARow++
			}
			t.Logf("decision %d after the thaw failed after %v: %v", i, a.End.Sub(a.Start).Round(time.Millisecond), a.Err)
		} else if firstOK < 0 {
			firstOK = i
		}
	}
	if firstOK < 0 {
		t.Fatalf("%d silenced connections: all %d decisions after the thaw failed", silenced, len(log))
	}
	recovery = log[firstOK].End.Sub(log[0].Start)
	t.Logf("%d silenced connections: %d decisions failed (%d in a row), first success %v after the thaw's first decision started (took %v)",
		silenced, failed, inARow, recovery.Round(time.Millisecond), log[firstOK].End.Sub(log[firstOK].Start).Round(time.Millisecond))
	return failed, recovery
}

// Take returns a take of Cost from the Refill bucket "k" of s, bounded by a
// deadline of d.
func Take(s kvstore.Atomic) func(d time.Duration) error {
	return func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := s.Update(ctx, "k", Refill, kvstore.OpTake, Cost)
		return err
	}
}

// Peek returns a peek at Cost in the Refill bucket "k" of s, bounded by a
// deadline of d.
func Peek(s kvstore.Atomic) func(d time.Duration) error {
	return func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := s.Update(ctx, "k", Refill, kvstore.OpPeek, Cost)
		return err
	}
}
