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
var Refill = kvstore.Refill{Max: kvstore.MaxValue, Rate: 1}

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

// A Reading is what the attempts after a thaw show.
type Reading struct {
	Failed   int           // decisions that failed
	InARow   int           // of them, before the first success
	FirstOK  int           // index of the first success
	Recovery time.Duration // from the first decision's start to the first success's end
}

// Read logs every failed attempt and a summary, and returns the reading. It
// fails the test at once when no attempt succeeded.
func Read(t testing.TB, silenced int, log []Attempt) Reading {
	t.Helper()
	r := Reading{FirstOK: -1}
	for i, a := range log {
		if a.Err != nil {
			r.Failed++
			if r.FirstOK < 0 {
				r.InARow++
			}
			t.Logf("decision %d after the thaw failed after %v: %v", i, a.End.Sub(a.Start).Round(time.Millisecond), a.Err)
		} else if r.FirstOK < 0 {
			r.FirstOK = i
		}
	}
	if r.FirstOK < 0 {
		t.Fatalf("%d silenced connections: all %d decisions after the thaw failed", silenced, len(log))
	}
	r.Recovery = log[r.FirstOK].End.Sub(log[0].Start)
	t.Logf("%d silenced connections: %d decisions failed (%d in a row), first success %v after the thaw's first decision started (took %v)",
		silenced, r.Failed, r.InARow, r.Recovery.Round(time.Millisecond), log[r.FirstOK].End.Sub(log[r.FirstOK].Start).Round(time.Millisecond))
	return r
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
