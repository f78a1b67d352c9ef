package tokenbucket_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/tokenbucket"
)

// BenchmarkAllowMemory measures one decision over the in-memory store, on
// one hot key and spread over 10,000 keys, serially and in parallel. The
// buckets hold 2^35 tokens and refill one every 100ms: they never deny and
// never refill to full (and expire) between two visits.
func BenchmarkAllowMemory(b *testing.B) {
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
	}
	for _, mode := range []tokenbucket.Mode{tokenbucket.Atomic, tokenbucket.Eventual} {
		for _, spread := range []string{"hot", "10k"} {
			newL := func(b *testing.B) *tokenbucket.Limiter {
				return newLimiter(b, tokenbucket.Config{Name: "bench", Burst: 1 << 35, RefillRate: tokenbucket.Rate{Tokens: 1, Per: 100 * time.Millisecond}, Mode: mode, Store: memStore(b, nil)})
			}
			key := func(i int) string {
				if spread == "hot" {
					return "hot"
				}
				return keys[i%len(keys)]
			}
			b.Run(mode.String()+"/"+spread+"/serial", func(b *testing.B) {
				l := newL(b)
				ctx := context.Background()
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					l.Allow(ctx, ratekit.Request{Key: key(i), Cost: 1})
					i++
				}
			})
			b.Run(mode.String()+"/"+spread+"/parallel", func(b *testing.B) {
				l := newL(b)
				ctx := context.Background()
				var seq atomic.Int64
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					i := int(seq.Add(1)) * 7919
					for pb.Next() {
						l.Allow(ctx, ratekit.Request{Key: key(i), Cost: 1})
						i++
					}
				})
			})
		}
	}
}

// BenchmarkAllowDeniedCached measures a denial answered by the denied-key
// cache.
func BenchmarkAllowDeniedCached(b *testing.B) {
	l := newLimiter(b, tokenbucket.Config{Name: "bench", Burst: 1, RefillRate: tokenbucket.PerHour(1), Mode: tokenbucket.Atomic, Store: memStore(b, nil), DeniedCacheSize: 1000})
	ctx := context.Background()
	req := ratekit.Request{Key: "blocked", Cost: 1}
	l.Allow(ctx, req)
	l.Allow(ctx, req)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if d, _ := l.Allow(ctx, req); d.Allowed {
				b.Fatal("admitted")
			}
		}
	})
}
