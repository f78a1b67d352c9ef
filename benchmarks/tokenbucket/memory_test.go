package tokenbucket_test

import (
	"context"
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

// The buckets hold 2^36 tokens and refill one every 100ms: they never deny,
// and a bucket never refills to full between two visits (a full memstore
// bucket has expired and is inserted afresh), so both sides do the work of an
// admitted request on a key they hold.
const (
	burst  = 1 << 36
	refill = 100 * time.Millisecond
)

var keys = func() []string {
	k := make([]string, 10_000)
	for i := range k {
		k[i] = "client-" + strconv.Itoa(i)
	}
	return k
}()

func key(spread string, i int) string {
	if spread == "hot" {
		return "hot"
	}
	return keys[i%len(keys)]
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

func BenchmarkMemory(b *testing.B) {
	for _, spread := range []string{"hot", "10k"} {
		b.Run("ratekit/"+spread+"/serial", func(b *testing.B) {
			l := newRatekit(b)
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				l.Allow(ctx, ratekit.Request{Key: key(spread, i), Cost: 1})
				i++
			}
		})
		b.Run("xrate/"+spread+"/serial", func(b *testing.B) {
			var x xrate
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				x.allow(key(spread, i))
				i++
			}
		})
		b.Run("golimiter/"+spread+"/serial", func(b *testing.B) {
			g := newGoLimiter(b)
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				g.allow(ctx, key(spread, i))
				i++
			}
		})
		b.Run("ratekit/"+spread+"/parallel", func(b *testing.B) {
			l := newRatekit(b)
			ctx := context.Background()
			var seq atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1)) * 7919
				for pb.Next() {
					l.Allow(ctx, ratekit.Request{Key: key(spread, i), Cost: 1})
					i++
				}
			})
		})
		b.Run("golimiter/"+spread+"/parallel", func(b *testing.B) {
			g := newGoLimiter(b)
			ctx := context.Background()
			var seq atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1)) * 7919
				for pb.Next() {
					g.allow(ctx, key(spread, i))
					i++
				}
			})
		})
		b.Run("xrate/"+spread+"/parallel", func(b *testing.B) {
			var x xrate
			var seq atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1)) * 7919
				for pb.Next() {
					x.allow(key(spread, i))
					i++
				}
			})
		})
	}
}
