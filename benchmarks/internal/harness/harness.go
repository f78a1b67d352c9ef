// Package harness is the measuring loop shared by the benchmark programs of
// this module: it runs a decision function from a number of concurrent
// workers for a fixed time and reports decisions per second, latency
// percentiles and the fraction admitted, and takes medians over runs.
//
// Latencies go into a per-worker log-linear histogram (64 sub-buckets per
// power of two, so a percentile is within 1.6% of the exact value; below 64
// ns exact), which keeps memory constant however many decisions a cell
// makes. Each decision costs one monotonic clock read (time.Since, not
// time.Now, which also reads the wall clock): the end of one decision is the
// start of the next. Workers share no memory while they measure, so that
// the harness itself adds no cache-line traffic between cores.
package harness

import (
	"context"
	"fmt"
	"math/bits"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Op makes decision i of worker w (both counted from 0) and reports whether
// it was admitted. It is called from several goroutines at once, each with its
// own w.
type Op func(ctx context.Context, w, i int) (admitted bool, err error)

// Result is what one measurement found.
type Result struct {
	// Throughput is decisions per second, all workers together.
	Throughput float64

	// P50 and P99 are the median and 99th percentile latency of one decision.
	P50, P99 time.Duration

	// Admitted is the fraction of decisions admitted, from 0 to 1.
	Admitted float64

	// Decisions is the number of decisions made.
	Decisions int64

	// Allocs is the heap allocations of this process per decision while
	// the decisions were made (runtime.MemStats.Mallocs; it counts the
	// process's other goroutines too, such as idle clients' background
	// work). It is negative when the decisions were made in another
	// process (Sample.AddBucket) or side by side with other ops
	// (MeasureInterleaved).
	Allocs float64
}

const (
	subBits  = 6
	sub      = 1 << subBits
	nBuckets = sub + (64-subBits)*sub
)

type histogram [nBuckets]uint64

func bucket(ns int64) int {
	v := uint64(max(ns, 0))
	if v < sub {
		return int(v)
	}
	e := bits.Len64(v) - subBits - 1 // v>>e is in [sub, 2*sub)
	return sub + e*sub + int(v>>e) - sub
}

// value returns the middle of bucket b in nanoseconds.
func value(b int) time.Duration {
	if b < sub {
		return time.Duration(b)
	}
	e := (b - sub) / sub
	m := uint64(b-sub-e*sub) + sub
	return time.Duration(m<<e + (uint64(1)<<e)/2)
}

// Measure runs op from workers goroutines for d and returns what it found.
// It stops at the first error, which it returns.
func Measure(ctx context.Context, workers int, d time.Duration, op Op) (Result, error) {
	var s Sample
	if err := s.measure(ctx, workers, d, op); err != nil {
		return Result{}, err
	}
	if s.decisions == 0 {
		return Result{}, fmt.Errorf("harness: no decision completed in %v", d)
	}
	return s.Result(), nil
}

// Sample accumulates the decisions of one contender over one or more
// measuring slices: their latencies, how many were admitted, and the time
// the slices took. The zero Sample is empty and ready to use.
type Sample struct {
	hist      histogram
	decisions int64
	admitted  int64
	elapsed   time.Duration
	// mallocs counts this process's allocations over the decisions that
	// measure made; outside says that some decisions came from AddBucket.
	mallocs uint64
	outside bool
}

// AddBucket adds n decisions whose latency falls in bucket b of the
// histogram, numbered as Bucket numbers them (for a contender that measures
// itself, in another process).
func (s *Sample) AddBucket(b int, n uint64) error {
	if b < 0 || b >= nBuckets {
		return fmt.Errorf("harness: bucket %d out of range", b)
	}
	s.hist[b] += n
	s.decisions += int64(n)
	s.outside = true
	return nil
}

// AddCounts adds admitted decisions and elapsed measuring time.
func (s *Sample) AddCounts(admitted int64, elapsed time.Duration) {
	s.admitted += admitted
	s.elapsed += elapsed
}

// Bucket returns the histogram bucket of a latency of ns nanoseconds: below
// 64 the latency itself, then 64 buckets per power of two.
func Bucket(ns int64) int { return bucket(ns) }

// Result returns throughput (decisions over the slices' time), percentiles
// and the admitted fraction of the decisions added so far.
func (s *Sample) Result() Result {
	if s.decisions == 0 || s.elapsed <= 0 {
		return Result{}
	}
	allocs := -1.0
	if !s.outside {
		allocs = float64(s.mallocs) / float64(s.decisions)
	}
	return Result{
		Throughput: float64(s.decisions) / s.elapsed.Seconds(),
		P50:        s.hist.quantile(s.decisions, 0.50),
		P99:        s.hist.quantile(s.decisions, 0.99),
		Admitted:   float64(s.admitted) / float64(s.decisions),
		Decisions:  s.decisions,
		Allocs:     allocs,
	}
}

// measure runs op from workers goroutines for d and adds what it found to s.
func (s *Sample) measure(ctx context.Context, workers int, d time.Duration, op Op) error {
	if workers < 1 {
		return fmt.Errorf("harness: %d workers", workers)
	}
	hists := make([]histogram, workers)
	admitted := make([]int64, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := &hists[w]
			var adm int64 // local: neighbouring workers' counters share cache lines
			defer func() { admitted[w] = adm }()
			t0 := time.Since(start)
			for i := 0; t0 < d; i++ {
				ok, err := op(ctx, w, i)
				if err != nil {
					errs[w] = fmt.Errorf("worker %d, decision %d: %w", w, i, err)
					return
				}
				t1 := time.Since(start)
				h[bucket(int64(t1-t0))]++
				if ok {
					adm++
				}
				t0 = t1
			}
		}()
	}
	wg.Wait()
	s.elapsed += time.Since(start)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	s.mallocs += after.Mallocs - before.Mallocs
	for w := range workers {
		if errs[w] != nil {
			return errs[w]
		}
		for b, c := range hists[w] {
			s.hist[b] += c
			s.decisions += int64(c)
		}
		s.admitted += admitted[w]
	}
	return nil
}

// Runner measures one contender from workers concurrent callers for about d
// and adds what it found to s.
type Runner func(ctx context.Context, workers int, d time.Duration, s *Sample) error

// OpRunner returns the Runner that calls op from workers goroutines, as
// Measure does.
func OpRunner(op Op) Runner {
	return func(ctx context.Context, workers int, d time.Duration, s *Sample) error {
		return s.measure(ctx, workers, d, op)
	}
}

// MeasureInTurn measures runners at the same concurrency in turn: slices of
// length slice, one runner after the other, starting each round one runner
// further, until each has run for about d. Each runner has all workers to
// itself during its slices, and the slices of all runners are spread over
// the same seconds, so that a machine whose speed drifts hits them alike.
// Throughput is decisions over the runner's own slices' time.
func MeasureInTurn(ctx context.Context, workers int, d, slice time.Duration, runners []Runner) ([]Result, error) {
	if slice <= 0 || d <= 0 {
		return nil, fmt.Errorf("harness: slice %v, duration %v", slice, d)
	}
	samples := make([]Sample, len(runners))
	rounds := max(int((d+slice-1)/slice), 1)
	for r := range rounds {
		for k := range runners {
			j := (k + r) % len(runners)
			if err := runners[j](ctx, workers, slice, &samples[j]); err != nil {
				return nil, fmt.Errorf("runner %d: %w", j, err)
			}
		}
	}
	out := make([]Result, len(runners))
	for j := range samples {
		if samples[j].decisions == 0 {
			return nil, fmt.Errorf("harness: runner %d completed no decision", j)
		}
		out[j] = samples[j].Result()
	}
	return out, nil
}

// MeasureInterleaved measures ops side by side from one goroutine: it makes
// one decision with each op in turn, starting each round one op further, for
// d in all, and returns one Result per op. Throughput is one over the mean
// latency. On a shared machine whose speed drifts from second to second,
// this pairs the ops' samples in time, so that a difference at concurrency 1
// smaller than the drift between two separate measurements still shows.
func MeasureInterleaved(ctx context.Context, d time.Duration, ops []Op) ([]Result, error) {
	if len(ops) == 0 {
		return nil, nil
	}
	hists := make([]histogram, len(ops))
	admitted := make([]int64, len(ops))
	total := make([]time.Duration, len(ops))
	start := time.Now()
	// Every round makes one decision with each op: rounds is each op's count.
	rounds := 0
	for ; time.Since(start) < d; rounds++ {
		for k := range ops {
			j := (k + rounds) % len(ops)
			t0 := time.Since(start)
			ok, err := ops[j](ctx, 0, rounds)
			if err != nil {
				return nil, fmt.Errorf("op %d, decision %d: %w", j, rounds, err)
			}
			lat := time.Since(start) - t0
			hists[j][bucket(int64(lat))]++
			total[j] += lat
			if ok {
				admitted[j]++
			}
		}
	}
	out := make([]Result, len(ops))
	n := int64(rounds)
	for j := range ops {
		out[j] = Result{
			Throughput: float64(n) / total[j].Seconds(),
			P50:        hists[j].quantile(n, 0.50),
			P99:        hists[j].quantile(n, 0.99),
			Admitted:   float64(admitted[j]) / float64(n),
			Decisions:  n,
			Allocs:     -1,
		}
	}
	return out, nil
}

// quantile returns the latency below which a fraction q of the n recorded
// decisions fall.
func (h *histogram) quantile(n int64, q float64) time.Duration {
	rank := max(int64(q*float64(n)+0.999999), 1)
	var seen int64
	for b, c := range h {
		seen += int64(c)
		if seen >= rank {
			return value(b)
		}
	}
	return value(nBuckets - 1)
}

// Median returns the median of each figure of rs over the runs (the mean of
// the middle two for an even count). rs must not be empty.
func Median(rs []Result) Result {
	med := func(get func(Result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = get(r)
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return Result{
		Throughput: med(func(r Result) float64 { return r.Throughput }),
		P50:        time.Duration(med(func(r Result) float64 { return float64(r.P50) })),
		P99:        time.Duration(med(func(r Result) float64 { return float64(r.P99) })),
		Admitted:   med(func(r Result) float64 { return r.Admitted }),
		Decisions:  int64(med(func(r Result) float64 { return float64(r.Decisions) })),
		Allocs:     med(func(r Result) float64 { return r.Allocs }),
	}
}

// ParseCounts parses a comma-separated list of positive integers, such as a
// -concurrency flag.
func ParseCounts(list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// Latency formats a latency for a table: nanoseconds below 1 µs, then three
// significant digits in µs or ms.
func Latency(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%d ns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.3g µs", float64(d)/float64(time.Microsecond))
	}
	return fmt.Sprintf("%.3g ms", float64(d)/float64(time.Millisecond))
}
