package rueidisstore_test

import (
	"testing"
	"time"

	"github.com/ratekit/ratekit/internal/plannedtest"
	"github.com/ratekit/ratekit/tokenbucket"
)

// TestPlannedConcurrent: 8 goroutines on one key of a monthly quota of 50,
// through rueidis's auto-pipelining, admit exactly min(demand, quota), and
// Usage reads back the sum of the admitted costs. (The calendar scenarios
// run on kvstore/redisstore, over the same script.)
func TestPlannedConcurrent(t *testing.T) {
	s, _ := newStore(t)
	plans := &plannedtest.Plans{}
	l, err := tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Prefix: "api", Store: s, Plan: plans.Plan})
	if err != nil {
		t.Fatal(err)
	}
	plans.Set("k", plannedtest.Monthly("m", 50, time.Time{}, nil))
	if admitted, used := plannedtest.Race(t, l, "k", 8, 20, 1); admitted != 50 || used != 50 {
		t.Fatalf("admitted %d units, usage reads %d; want 50 and 50", admitted, used)
	}
	plans.Set("v", plannedtest.Monthly("m", 50, time.Time{}, nil))
	if admitted, used := plannedtest.Race(t, l, "v", 8, 20, 3); admitted > 50 || admitted < 48 || used != admitted {
		t.Fatalf("costs 1 to 3: admitted %d units, usage reads %d; want 48 to 50, and equal", admitted, used)
	}
}
