package durable_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
)

// parallel runs op from callers goroutines with b.RunParallel (exactly
// callers when GOMAXPROCS divides it: run with -cpu 1 for the 1-caller
// case), op's argument counting up from a distinct start in each.
func parallel(b *testing.B, callers int, op func(i int) error) {
	b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
	var n atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(n.Add(1)) * 7919
		for pb.Next() {
			i++
			if err := op(i); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkPlannedAllow compares a decision of a burst and a monthly quota
// with a plan lookup (Planned, the plan served from memory) against the
// same two policies in a fixed Composite, on one key, at 1, 8 and 64
// callers, each with a pool of as many connections: both coalesce alike.
//
//	go test -run '^$' -bench PlannedAllow -cpu 1 -benchtime 2s ./durable
func BenchmarkPlannedAllow(b *testing.B) {
	burst := ratekit.Policy{Name: "burst", Quota: 1_000_000, Window: time.Hour, Algorithm: ratekit.TokenBucket}
	monthly := ratekit.Policy{Name: "monthly", Quota: 1_000_000_000, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Month}}
	ctx := context.Background()
	for _, callers := range []int{1, 8, 64} {
		s := newStore(b, pgstoretest.PostgresURL(b), int32(callers))
		prefix := pgstoretest.Prefix(b)
		allow := func(l ratekit.Limiter) func(int) error {
			return func(int) error {
				d, err := l.Allow(ctx, ratekit.Request{Key: "hot", Cost: 1})
				if err == nil && !d.Allowed {
					b.Fatalf("denied: %+v", d)
				}
				return err
			}
		}
		b.Run("composite/callers="+strconv.Itoa(callers), func(b *testing.B) {
			lb, err := durable.New(durable.Config{Store: s, Policy: burst, Prefix: prefix + "-cb", Durability: durable.Logged, CleanupProbability: -1})
			if err != nil {
				b.Fatal(err)
			}
			lm, err := durable.New(durable.Config{Store: s, Policy: monthly, Prefix: prefix + "-cm", Durability: durable.Logged, CleanupProbability: -1})
			if err != nil {
				b.Fatal(err)
			}
			parallel(b, callers, allow(newComposite(b, lb, lm)))
		})
		b.Run("planned/callers="+strconv.Itoa(callers), func(b *testing.B) {
			m := monthly
			m.Period.Anchor = time.Date(2026, time.January, 9, 9, 0, 0, 0, time.UTC)
			plan := ratekit.Plan{Name: "pro", Policies: []ratekit.Policy{burst, m}}
			p, err := durable.NewPlanned(durable.PlannedConfig{Store: s, Prefix: prefix + "-p", Durability: durable.Logged, CleanupProbability: -1,
				Plan: func(context.Context, string) (ratekit.Plan, error) { return plan, nil }})
			if err != nil {
				b.Fatal(err)
			}
			parallel(b, callers, allow(p))
		})
	}
}

// BenchmarkCoalescing runs a logged fixed window with synchronous commit
// from 8 and 64 callers (a pool of as many connections) on 10,000 keys and
// on one hot key: with the Store's default coalescing (at most 2 decisions
// in flight, so coalescing from the third caller on, whatever the keys);
// with at most 8 in flight; with as many in flight as callers (coalescing
// only on a hot key);
// and a bare upsert per decision on the same pool.
//
//	go test -run '^$' -bench Coalescing -cpu 1 -benchtime 2s ./durable
func BenchmarkCoalescing(b *testing.B) {
	ctx := context.Background()
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "customer-" + strconv.Itoa(i)
	}
	pick := map[string]func(i int) string{
		"distinct": func(i int) string { return keys[(i*7919)%len(keys)] },
		"hot":      func(int) string { return "hot" },
	}
	policy := ratekit.Policy{Name: pgstoretest.Prefix(b), Quota: 1_000_000_000, Window: time.Minute, Algorithm: ratekit.FixedWindow}
	for _, callers := range []int{8, 64} {
		pool := pgstoretest.Pool(b, pgstoretest.PostgresURL(b), int32(callers), "")
		for _, cells := range []string{"distinct", "hot"} {
			key := pick[cells]
			name := "callers=" + strconv.Itoa(callers) + "/" + cells
			for _, mode := range []struct {
				name        string
				maxInFlight int
			}{{"default", 0}, {"maxinflight=8", 8}, {"maxinflight=callers", callers}} {
				b.Run(name+"/"+mode.name, func(b *testing.B) {
					s, err := pgstore.New(pool, pgstore.Config{Schema: pgstoretest.Schema(), MaxInFlight: mode.maxInFlight})
					if err != nil {
						b.Fatal(err)
					}
					l, err := durable.New(durable.Config{Store: s, Policy: policy, Durability: durable.Logged, SynchronousCommit: true, CleanupProbability: -1})
					if err != nil {
						b.Fatal(err)
					}
					parallel(b, callers, func(i int) error {
						_, err := l.Allow(ctx, ratekit.Request{Key: key(i), Cost: 1})
						return err
					})
				})
			}
			b.Run(name+"/upsert", func(b *testing.B) {
				table := `"` + pgstoretest.Schema() + `".bench_upsert`
				if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+table+" (key text PRIMARY KEY, count bigint NOT NULL)"); err != nil {
					b.Fatal(err)
				}
				q := "INSERT INTO " + table + " AS u (key, count) VALUES ($1, 1) ON CONFLICT (key) DO UPDATE SET count = u.count + 1 RETURNING count"
				parallel(b, callers, func(i int) error {
					var n int64
					return pool.QueryRow(ctx, q, pgx.QueryExecModeExec, key(i)).Scan(&n)
				})
			})
		}
	}
}
