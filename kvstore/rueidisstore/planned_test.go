package rueidisstore_test

import (
	"testing"

	"github.com/ratekit/ratekit/internal/plannedtest"
)

// TestPlannedConcurrent: 8 goroutines on keys of a monthly quota, through
// rueidis's auto-pipelining, admit exactly min(demand, quota), and Usage
// reads back the sum of the admitted costs. (The calendar scenarios run on
// kvstore/redisstore, over the same engine.)
func TestPlannedConcurrent(t *testing.T) {
	s, _ := newStore(t)
	plannedtest.CheckConcurrent(t, s, false)
}

// TestPlannedExtremes runs plannedtest.CheckExtremes on Redis through
// rueidis.
func TestPlannedExtremes(t *testing.T) {
	s, _ := newStore(t)
	plannedtest.CheckExtremes(t, s)
}
