package tokenbucket_test

import (
	"testing"

	"github.com/ratekit/ratekit/internal/plannedtest"
)

// BenchmarkPlannedAllow measures a decision of a burst and a monthly quota
// from a billing anchor with a plan lookup (Planned), against the same two
// policies in a fixed Composite (the month as a bucket), on memstore, from
// parallel goroutines over 1,024 keys.
func BenchmarkPlannedAllow(b *testing.B) {
	plannedtest.Bench(b, memStore(b, nil))
}
