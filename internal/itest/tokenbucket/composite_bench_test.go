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
	"github.com/ratekit/ratekit/internal/itest/faultproxy"
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
	// On loopback, a round trip costs about what the server's work does;
	// behind a network (1 ms more per round trip here, through a proxy),
	// the round trips that a composite saves are most of a decision's cost.
	proxy := faultproxy.Start(b, testenv.RedisAddr(b))
	proxy.ReplyLatency(time.Millisecond)
	redisAddr := func(b *testing.B, rtt bool) string {
		if rtt {
			return proxy.Listen
		}
		return testenv.RedisAddr(b)
	}
	rueidisStore := func(rtt bool) func(b *testing.B) kvstore.Store {
		return func(b *testing.B) kvstore.Store {
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{redisAddr(b, rtt)}, DisableCache: true})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(c.Close)
			s, err := rueidisstore.New(c, rueidisstore.Config{Prefix: "ratekit-bench:composite-rueidis:"})
			if err != nil {
				b.Fatal(err)
			}
			return s
		}
	}
	redisStore := func(rtt bool) func(b *testing.B) kvstore.Store {
		return func(b *testing.B) kvstore.Store {
			c := redis.NewClient(&redis.Options{Addr: redisAddr(b, rtt)})
			b.Cleanup(func() { c.Close() })
			s, err := redisstore.New(c, redisstore.Config{Prefix: "ratekit-bench:composite:"})
			if err != nil {
				b.Fatal(err)
			}
			return s
		}
	}
	stores := []struct {
		name  string
		store func(b *testing.B) kvstore.Store
	}{
		{"memory", func(b *testing.B) kvstore.Store { return memStore(b, nil) }},
		{"rueidis", rueidisStore(false)},
		{"redis", redisStore(false)},
		{"rueidis-rtt+1ms", rueidisStore(true)},
		{"redis-rtt+1ms", redisStore(true)},
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
