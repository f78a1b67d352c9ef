package pgengine_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable/internal/pgengine"
	"github.com/ratekit/ratekit/durable/internal/pgtest"
	"github.com/ratekit/ratekit/internal/testenv"
)

// BenchmarkTake compares one decision of each algorithm (UNLOGGED, admitted)
// with the floor: a bare INSERT … ON CONFLICT DO UPDATE … RETURNING counter
// through the same pool. The comparison program in benchmarks/durable
// covers concurrency, durability and synchronous_commit.
func BenchmarkTake(b *testing.B) {
	pool := pgtest.Pool(b, testenv.PostgresURL(b), 4, "")
	s := newStore(b, pool)
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	table := `"` + s.Schema() + `".bench_floor`
	if _, err := pool.Exec(ctx, "CREATE UNLOGGED TABLE IF NOT EXISTS "+table+" (prefix text, key bytea, count bigint NOT NULL, PRIMARY KEY (prefix, key))"); err != nil {
		b.Fatal(err)
	}
	keys := make([][]byte, 1000)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "customer-%04d", i)
	}
	run := func(b *testing.B, op func(key []byte) error) {
		var n atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := int(n.Add(1)) * 7919
			for pb.Next() {
				i++
				if err := op(keys[i%len(keys)]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	b.Run("floor", func(b *testing.B) {
		q := "INSERT INTO " + table + " AS f (prefix, key, count) VALUES ($1, $2, 1) ON CONFLICT (prefix, key) DO UPDATE SET count = f.count + 1 RETURNING count"
		run(b, func(key []byte) error {
			var n int64
			return pool.QueryRow(ctx, q, pgx.QueryExecModeExec, "floor", key).Scan(&n)
		})
	})
	for _, alg := range algorithms {
		b.Run(alg.String(), func(b *testing.B) {
			quota := int64(1 << 40)
			if alg == ratekit.TokenBucket {
				quota = 1 << 25 // a bucket refills at most one unit per 100µs of its window
			}
			c := newCounter(b, s, pgengine.CounterConfig{Algorithm: alg, Quota: quota, Window: time.Hour, CleanupProbability: pgengine.DefaultCleanupProbability, Durability: pgengine.Unlogged})
			if alg == ratekit.SlidingLog {
				// Keep the log short: a small quota over a short window.
				c = newCounter(b, s, pgengine.CounterConfig{Algorithm: alg, Quota: 1000, Window: 10 * time.Second, CleanupProbability: pgengine.DefaultCleanupProbability, Durability: pgengine.Unlogged})
			}
			run(b, func(key []byte) error {
				_, err := c.Take(ctx, string(key), 1, "")
				return err
			})
		})
	}
}
