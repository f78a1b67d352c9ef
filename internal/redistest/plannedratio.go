//go:build !js

package redistest

import (
	"context"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/plannedtest"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// BenchPlannedRatio measures a planned decision (plannedtest.BenchPlans's
// burst and monthly quota through tokenbucket.Planned) against the same
// policies in a tokenbucket.Composite on store, in alternating rounds in
// one process, so that the load of the machine weighs on both alike: each
// round runs ops decisions of one limiter, then of the other, from
// GOMAXPROCS goroutines (as b.RunParallel does with -cpu) over 1,024 keys.
// It reports the median over rounds of planned ÷ composite time
// (planned/composite), and the median time of a decision of each.
func BenchPlannedRatio(b *testing.B, store kvstore.Store) {
	planned, composite := plannedAndComposite(b, store, "ratio")
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	callers := runtime.GOMAXPROCS(0)
	const ops = 400
	// A round of each first, to open connections and write the records.
	run(b, planned, keys, callers, ops)
	run(b, composite, keys, callers, ops)
	rounds := max(b.N/(2*ops), 3)
	var ratios, tp, tc []float64
	b.ResetTimer()
	for r := range rounds {
		var first, second ratekit.Limiter = planned, composite
		if r%2 == 1 {
			first, second = composite, planned
		}
		d1, d2 := run(b, first, keys, callers, ops), run(b, second, keys, callers, ops)
		if r%2 == 1 {
			d1, d2 = d2, d1
		}
		ratios = append(ratios, float64(d1)/float64(d2))
		tp = append(tp, float64(d1)/ops)
		tc = append(tc, float64(d2)/ops)
	}
	b.StopTimer()
	b.ReportMetric(median(ratios), "planned/composite")
	b.ReportMetric(median(tp), "planned-ns/op")
	b.ReportMetric(median(tc), "composite-ns/op")
}

// run makes ops decisions of cost 1 on l from callers goroutines over
// keys and returns the time they took; a denial or an error fails b.
func run(b *testing.B, l ratekit.Limiter, keys []string, callers, ops int) time.Duration {
	var wg sync.WaitGroup
	start := time.Now()
	for g := range callers {
		n := ops / callers
		if g < ops%callers {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			i := g * 97
			for range n {
				i++
				d, err := l.Allow(ctx, ratekit.Request{Key: keys[i%len(keys)], Cost: 1})
				if err != nil || !d.Allowed {
					b.Errorf("Allow: %+v, %v", d, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

// median returns the median of v, which it sorts.
func median(v []float64) float64 {
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// plannedAndComposite returns a Planned of plannedtest's benchmark plan
// under prefix on store, and a Composite of the same policies' buckets.
func plannedAndComposite(tb testing.TB, store kvstore.Store, prefix string) (*tokenbucket.Planned, *tokenbucket.Composite) {
	tb.Helper()
	plan, fixed := plannedtest.BenchPlans()
	planned, err := tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Prefix: prefix, Store: store, Plan: plannedtest.BenchPlanFunc(plan)})
	if err != nil {
		tb.Fatal(err)
	}
	buckets := make([]tokenbucket.Bucket, len(fixed))
	for i, p := range fixed {
		buckets[i] = tokenbucket.Bucket{Name: p.Name, Burst: p.Quota, RefillRate: tokenbucket.Rate{Tokens: p.Quota, Per: p.Window}}
	}
	composite, err := tokenbucket.NewComposite(tokenbucket.CompositeConfig{Buckets: buckets, Mode: tokenbucket.Atomic, Store: store})
	if err != nil {
		tb.Fatal(err)
	}
	return planned, composite
}
