package rueidisstore_test

import (
	"testing"

	"github.com/ratekit/ratekit/internal/plannedtest"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
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

// BenchmarkPlannedAllow measures a decision of a burst and a monthly quota
// with a plan lookup (tokenbucket.Planned, one script that reads TIME)
// against the same two policies in a fixed tokenbucket.Composite, on the
// shared test Redis through rueidis, from parallel goroutines over 1,024
// keys.
func BenchmarkPlannedAllow(b *testing.B) {
	plannedtest.Bench(b, benchStore(b))
}

// BenchmarkPlannedRatio measures BenchmarkPlannedAllow's two limiters in
// alternating rounds in one process (redistest.BenchPlannedRatio) and
// reports the median of planned ÷ composite time.
func BenchmarkPlannedRatio(b *testing.B) {
	redistest.BenchPlannedRatio(b, benchStore(b))
}

// benchStore returns a Store on the shared test Redis through a client of
// its own, under a prefix whose keys are deleted when b ends.
func benchStore(b *testing.B) *rueidisstore.Store {
	p := redistest.Prefix(b)
	c := newClient(b, testenv.RedisAddr(b))
	cleanKeys(b, c, p)
	s, err := rueidisstore.New(c, rueidisstore.Config{Prefix: p})
	if err != nil {
		b.Fatal(err)
	}
	return s
}
