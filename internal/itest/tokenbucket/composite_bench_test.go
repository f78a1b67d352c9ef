package tokenbucket_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// BenchmarkComposite compares, side by side in one run, a decision of a
// composite of two buckets with a decision of one bucket (Limiter), on the
// in-memory store and on the shared Redis (through go-redis and rueidis),
// in parallel over 10,000 keys. The buckets never deny.
func BenchmarkComposite(b *testing.B) {
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
	}
	big := tokenbucket.Rate{Tokens: 1, Per: 100 * time.Millisecond}
	stores := []struct {
		name  string
		store func(b *testing.B) kvstore.Store
	}{
		{"memory", func(b *testing.B) kvstore.Store { return memStore(b, nil) }},
		{"rueidis", func(b *testing.B) kvstore.Store {
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{testenv.RedisAddr(b)}, DisableCache: true})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(c.Close)
			s, err := rueidisstore.New(c, rueidisstore.Config{Prefix: "ratekit-bench:composite-rueidis:"})
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
		{"redis", func(b *testing.B) kvstore.Store {
			c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(b)})
			b.Cleanup(func() { c.Close() })
			s, err := redisstore.New(c, redisstore.Config{Prefix: "ratekit-bench:composite:"})
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
	}
	for _, st := range stores {
		for _, kind := range []string{"single", "composite2"} {
			b.Run(st.name+"/"+kind, func(b *testing.B) {
				store := st.store(b)
				var l ratekit.Limiter
				if kind == "single" {
					l = newLimiter(b, tokenbucket.Config{Name: "burst", Burst: 1 << 30, RefillRate: big, Mode: tokenbucket.Atomic, Store: store})
				} else {
					l = newComposite(b, tokenbucket.CompositeConfig{Mode: tokenbucket.Atomic, Store: store, Buckets: []tokenbucket.Bucket{
						{Name: "burst", Burst: 1 << 30, RefillRate: big},
						{Name: "daily", Burst: 1 << 30, RefillRate: big},
					}})
				}
				ctx := context.Background()
				var seq atomic.Int64
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					i := int(seq.Add(1)) * 7919
					for pb.Next() {
						if _, err := l.Allow(ctx, ratekit.Request{Key: keys[i%len(keys)], Cost: 1}); err != nil {
							b.Error(err)
							return
						}
						i++
					}
				})
			})
		}
	}
}
