package tokenbucket_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	ulule "github.com/ulule/limiter/v3"
	ulredis "github.com/ulule/limiter/v3/drivers/store/redis"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// BenchmarkRedis puts one atomic ratekit decision (on redisstore, and on
// rueidisstore as ratekit-rueidis) beside one redis_rate
// decision, one ulule decision and a bare INCR on the Redis at
// RATEKIT_REDIS_ADDR (default 127.0.0.1:6379), on one hot key that never
// denies and on one exhausted key, for time and allocations per decision;
// the compare program gives latency percentiles and more scenarios.
func BenchmarkRedis(b *testing.B) {
	addr := os.Getenv("RATEKIT_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	ctx := context.Background()
	if err := client.Ping(ctx).Err(); err != nil {
		b.Skipf("no Redis at %s: %v", addr, err)
	}
	buf := make([]byte, 6)
	rand.Read(buf)
	prefix := "ratekit-bench:" + hex.EncodeToString(buf) + ":"
	defer func() {
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			client.Del(ctx, iter.Val())
		}
	}()

	store, err := redisstore.New(client, redisstore.Config{Prefix: prefix + "rk:"})
	if err != nil {
		b.Fatal(err)
	}
	rk, err := tokenbucket.New(tokenbucket.Config{Name: "open", Burst: 1_000_000_000, RefillRate: tokenbucket.PerHour(1_000_000_000), Mode: tokenbucket.Atomic, Store: store})
	if err != nil {
		b.Fatal(err)
	}
	rkDenied, err := tokenbucket.New(tokenbucket.Config{Name: "denied", Burst: 1, RefillRate: tokenbucket.PerHour(1), Mode: tokenbucket.Atomic, Store: store})
	if err != nil {
		b.Fatal(err)
	}
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	defer rc.Close()
	rstore, err := rueidisstore.New(rc, rueidisstore.Config{Prefix: prefix + "rr-store:"})
	if err != nil {
		b.Fatal(err)
	}
	rkRueidis, err := tokenbucket.New(tokenbucket.Config{Name: "open", Burst: 1_000_000_000, RefillRate: tokenbucket.PerHour(1_000_000_000), Mode: tokenbucket.Atomic, Store: rstore})
	if err != nil {
		b.Fatal(err)
	}
	rrl := redis_rate.NewLimiter(client)
	rrLimit := redis_rate.Limit{Rate: 1_000_000_000, Burst: 1_000_000_000, Period: time.Hour}
	rrDenied := redis_rate.Limit{Rate: 1, Burst: 1, Period: time.Hour}
	ulStore, err := ulredis.NewStoreWithOptions(client, ulule.StoreOptions{Prefix: prefix + "ul", MaxRetry: 3})
	if err != nil {
		b.Fatal(err)
	}
	ul := ulule.New(ulStore, ulule.Rate{Period: time.Hour, Limit: 1_000_000_000})
	ulDenied := ulule.New(ulStore, ulule.Rate{Period: time.Hour, Limit: 1})
	// Exhaust the denied keys.
	for range 2 {
		rkDenied.Allow(ctx, ratekit.Request{Key: "d", Cost: 1})
		rrl.Allow(ctx, prefix+"rr:d", rrDenied)
		ulDenied.Get(ctx, "d")
	}

	ops := []struct {
		name string
		op   func() error
	}{
		{"ratekit", func() error {
			_, err := rk.Allow(ctx, ratekit.Request{Key: "hot", Cost: 1})
			return err
		}},
		{"ratekit-rueidis", func() error {
			_, err := rkRueidis.Allow(ctx, ratekit.Request{Key: "hot", Cost: 1})
			return err
		}},
		{"redis_rate", func() error {
			_, err := rrl.Allow(ctx, prefix+"rr:hot", rrLimit)
			return err
		}},
		{"ulule", func() error {
			_, err := ul.Get(ctx, "hot")
			return err
		}},
		{"ratekit/denied", func() error {
			_, err := rkDenied.Allow(ctx, ratekit.Request{Key: "d", Cost: 1})
			return err
		}},
		{"redis_rate/denied", func() error {
			_, err := rrl.Allow(ctx, prefix+"rr:d", rrDenied)
			return err
		}},
		{"ulule/denied", func() error {
			_, err := ulDenied.Get(ctx, "d")
			return err
		}},
		{"INCR", func() error { return client.Incr(ctx, prefix+"incr").Err() }},
	}
	for _, o := range ops {
		b.Run(o.name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := o.op(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(o.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(4)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := o.op(); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
