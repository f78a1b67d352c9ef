package tokenbucket_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sethvargo/go-limiter/memorystore"
	"golang.org/x/time/rate"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// The buckets hold 2^35 tokens and refill one every 100ms: they never deny,
// and a bucket never refills to full between two visits (a full memstore
// bucket has expired and is inserted afresh), so both sides do the work of an
// admitted request on a key they hold.
const (
	burst  = 1 << 35
	refill = 100 * time.Millisecond
)

var keys = func() []string {
	k := make([]string, 10_000)
	for i := range k {
		k[i] = "client-" + strconv.Itoa(i)
	}
	return k
}()

// key returns the key of decision i: "hot", or one of the 10,000 keys in an
// order that jumps across them (7919 is prime to 10,000), so that, as in
// the side-by-side comparison's uniform draw, consecutive decisions do not
// find their keys in neighbouring memory.
func key(spread string, i int) string {
	if spread == "hot" {
		return "hot"
	}
	return keys[(i*7919)%len(keys)]
}

// xrate is the usual way to limit per key with x/time/rate: one Limiter per
// key in a sync.Map.
type xrate struct{ m sync.Map }

func (x *xrate) allow(key string) bool {
	v, ok := x.m.Load(key)
	if !ok {
		v, _ = x.m.LoadOrStore(key, rate.NewLimiter(rate.Every(refill), burst))
	}
	return v.(*rate.Limiter).Allow()
}

func newRatekit(b *testing.B) *tokenbucket.Limiter {
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		b.Fatal(err)
	}
	l, err := tokenbucket.New(tokenbucket.Config{Name: "bench", Burst: burst, RefillRate: tokenbucket.Rate{Tokens: 1, Per: refill}, Mode: tokenbucket.Atomic, Store: store})
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// newGoLimiter is sethvargo/go-limiter's memorystore with the same bucket:
// it refills its whole quota each interval, so an interval of burst × refill
// never refills within a run either.
func newGoLimiter(b *testing.B) *goLimiter {
	s, err := memorystore.New(&memorystore.Config{Tokens: burst, Interval: burst * refill})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close(context.Background()) })
	return &goLimiter{s}
}

type goLimiter struct {
	s interface {
		Take(context.Context, string) (uint64, uint64, uint64, bool, error)
	}
}

func (g *goLimiter) allow(ctx context.Context, key string) bool {
	_, _, _, ok, _ := g.s.Take(ctx, key)
	return ok
}

// BenchmarkMemory times one admitted decision with each contender, from one
// goroutine and from eight (RunParallel with a parallelism that starts at
// least eight goroutines whatever GOMAXPROCS is), on one hot key and on
// 10,000 keys. The contenders of one cell run one after the other, so that
// -count interleaves them under the same load. Each contender is called
// through a func value, which costs all of them alike.
func BenchmarkMemory(b *testing.B) {
	ctx := context.Background()
	contenders := []struct {
		name string
		new  func(b *testing.B) func(key string) bool
	}{
		{"ratekit", func(b *testing.B) func(string) bool {
			l := newRatekit(b)
			return func(key string) bool {
				d, _ := l.Allow(ctx, ratekit.Request{Key: key, Cost: 1})
				return d.Allowed
			}
		}},
		{"xrate", func(*testing.B) func(string) bool { return new(xrate).allow }},
		{"golimiter", func(b *testing.B) func(string) bool {
			g := newGoLimiter(b)
			return func(key string) bool { return g.allow(ctx, key) }
		}},
	}
	for _, spread := range []string{"hot", "10k"} {
		for _, callers := range []int{1, 8} {
			for _, c := range contenders {
				b.Run(fmt.Sprintf("%s/%d/%s", spread, callers, c.name), func(b *testing.B) {
					allow := c.new(b)
					b.ReportAllocs()
					if callers == 1 {
						i := 0
						for b.Loop() {
							allow(key(spread, i))
							i++
						}
						return
					}
					var seq atomic.Int64
					procs := runtime.GOMAXPROCS(0)
					b.SetParallelism((callers + procs - 1) / procs)
					b.RunParallel(func(pb *testing.PB) {
						i := int(seq.Add(1)) * 7919
						for pb.Next() {
							allow(key(spread, i))
							i++
						}
					})
				})
			}
		}
	}
}

// BenchmarkMemoryInTurn measures the same cells as BenchmarkMemory in a way
// that a loaded machine disturbs less: each iteration runs one chunk of
// decisions with every contender in turn (8,192 decisions, from one
// goroutine or spread over eight started together), and each contender's
// speed is the median of its chunks' decisions per second. A chunk that
// another process interrupted is an outlier the median ignores, and the
// contenders share the machine's state within a few milliseconds. It
// reports each contender's median in millions of decisions per second and
// ratekit's ratio to the faster peer (the median of per-round ratios).
func BenchmarkMemoryInTurn(b *testing.B) {
	const chunk = 8192
	ctx := context.Background()
	for _, spread := range []string{"hot", "10k"} {
		for _, callers := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/%d", spread, callers), func(b *testing.B) {
				l := newRatekit(b)
				g := newGoLimiter(b)
				x := new(xrate)
				contenders := []func(string) bool{
					func(key string) bool {
						d, _ := l.Allow(ctx, ratekit.Request{Key: key, Cost: 1})
						return d.Allowed
					},
					x.allow,
					func(key string) bool { return g.allow(ctx, key) },
				}
				speeds := make([][]float64, len(contenders))
				var ratios []float64
				b.ReportAllocs()
				for round := 0; b.Loop(); round++ {
					var s [3]float64
					for c, allow := range contenders {
						s[c] = chunk / runChunk(allow, spread, callers, chunk, round).Seconds()
						speeds[c] = append(speeds[c], s[c])
					}
					ratios = append(ratios, s[0]/max(s[1], s[2]))
				}
				for c, name := range []string{"ratekit", "xrate", "golimiter"} {
					b.ReportMetric(median(speeds[c])/1e6, "M/s-"+name)
				}
				b.ReportMetric(median(ratios), "ratio")
			})
		}
	}
}

// runChunk makes n decisions with allow, from callers goroutines started
// together, and returns the time they took.
func runChunk(allow func(string) bool, spread string, callers, n, round int) time.Duration {
	if callers == 1 {
		start := time.Now()
		for i := range n {
			allow(key(spread, round*n+i))
		}
		return time.Since(start)
	}
	var ready, done sync.WaitGroup
	ready.Add(1)
	per := n / callers
	for w := range callers {
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Wait()
			base := (round*callers + w) * 7919
			for i := range per {
				allow(key(spread, base+i))
			}
		}()
	}
	start := time.Now()
	ready.Done()
	done.Wait()
	return time.Since(start)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
