package pgengine_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable/internal/pgengine"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
)

const (
	burstPools      = 4
	burstGoroutines = 64
	burstLimit      = 100
	burstConns      = 8 // per pool; the test server is shared
)

// TestRemainingExact sends concurrent bursts on one key from four pools
// ("instances", 8 connections each) × 64 goroutines, directly and through PgBouncer in
// transaction mode, and checks that the Remaining values of the admitted
// takes are exactly the distinct values limit-1 … 0. The window is a day, so
// no unit refills during a burst and the truth is the same for every
// algorithm.
//
// A decision must read the database clock only after it holds the key's
// lock: one that read the clock and then waited saw a state written "in its
// future", and the token bucket then reported one unit fewer than remained
// (and could deny the last unit). Plain bursts hit that interleaving only
// now and then, so the "stalled" bursts force it: a transaction locks the
// counters table, the burst's decisions queue behind it, and the
// transaction takes the first unit itself before it commits, so every
// queued decision is granted its lock after a later decision committed.
// (The sliding log serialises on an advisory lock the test cannot hold, so
// it runs plain bursts only.)
func TestRemainingExact(t *testing.T) {
	admin := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 2, "")
	for _, via := range []string{"postgres", "pgbouncer"} {
		t.Run(via, func(t *testing.T) {
			url := pgstoretest.PostgresURL(t)
			if via == "pgbouncer" {
				url = pgstoretest.PgBouncerURL(t)
			}
			var stores []*pgengine.Store
			for i := 0; i < burstPools; i++ {
				stores = append(stores, newStore(t, pgstoretest.Pool(t, url, burstConns, "")))
			}
			for _, alg := range algorithms {
				t.Run(alg.String(), func(t *testing.T) {
					ctx := ctxT(t)
					prefix := pgstoretest.Prefix(t)
					var counters []*pgengine.Counter
					for _, s := range stores {
						counters = append(counters, newCounter(t, s, pgengine.CounterConfig{
							Prefix: prefix, Algorithm: alg, Quota: burstLimit, Window: 24 * time.Hour, Durability: pgengine.Unlogged,
						}))
					}
					warmUp(ctx, t, counters)
					t.Run("plain", func(t *testing.T) {
						for round := 0; round < 5; round++ {
							remaining, denied := burst(ctx, t, counters, fmt.Sprintf("plain-%d", round), nil)
							checkRemaining(t, remaining, denied, burstPools*burstGoroutines-burstLimit)
						}
					})
					if alg == ratekit.SlidingLog {
						return
					}
					t.Run("stalled", func(t *testing.T) {
						tx, err := admin.Begin(ctx)
						if err != nil {
							t.Fatal(err)
						}
						defer tx.Rollback(ctx)
						if _, err := tx.Exec(ctx, fmt.Sprintf(`LOCK TABLE "%s".counters_unlogged IN EXCLUSIVE MODE`, pgstoretest.Schema())); err != nil {
							t.Fatal(err)
						}
						inTx := newCounter(t, newStore(t, tx), pgengine.CounterConfig{
							Prefix: prefix, Algorithm: alg, Quota: burstLimit, Window: 24 * time.Hour, Durability: pgengine.Unlogged,
						})
						var first pgengine.Outcome
						remaining, denied := burst(ctx, t, counters, "stalled", func() {
							waitForLockWaiters(ctx, t, admin, 8)
							if first, err = inTx.Take(ctx, "stalled", 1, ""); err != nil {
								t.Error(err)
							}
							if err := tx.Commit(ctx); err != nil {
								t.Error(err)
							}
						})
						if !first.Allowed {
							t.Fatalf("first take in the locking transaction: %+v", first)
						}
						checkRemaining(t, append(remaining, first.Remaining), denied, burstPools*burstGoroutines+1-burstLimit)
					})
				})
			}
		})
	}
}

// warmUp opens every pool's connections so that a burst is not spread out
// by connection setup.
func warmUp(ctx context.Context, t *testing.T, counters []*pgengine.Counter) {
	t.Helper()
	var wg sync.WaitGroup
	for _, c := range counters {
		for g := 0; g < burstConns; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := c.Peek(ctx, "warm-up", 1); err != nil {
					t.Error(err)
				}
			}()
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}

// burst takes one unit of key from burstGoroutines goroutines per counter,
// all released at once, runs during (if not nil) while they are under way,
// and returns the Remaining values of the admitted takes and the number of
// denials.
func burst(ctx context.Context, t *testing.T, counters []*pgengine.Counter, key string, during func()) (remaining []int64, denied int) {
	t.Helper()
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	start := make(chan struct{})
	for _, c := range counters {
		for g := 0; g < burstGoroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r, err := c.Take(ctx, key, 1, "")
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if r.Allowed {
					remaining = append(remaining, r.Remaining)
				} else {
					denied++
					if r.Remaining != 0 {
						t.Errorf("%s: denied with Remaining %d, want 0", key, r.Remaining)
					}
				}
			}()
		}
	}
	close(start)
	if during != nil {
		during()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return remaining, denied
}

// checkRemaining fails t unless remaining holds exactly the values
// burstLimit-1 … 0, once each, and wantDenied takes were denied.
func checkRemaining(t *testing.T, remaining []int64, denied, wantDenied int) {
	t.Helper()
	slices.Sort(remaining)
	ok := len(remaining) == burstLimit && denied == wantDenied
	for i, v := range remaining {
		ok = ok && v == int64(i)
	}
	if !ok {
		t.Fatalf("%d admitted, %d denied (want %d, %d); sorted Remaining values %v; want exactly 0 … %d once each",
			len(remaining), denied, burstLimit, wantDenied, remaining, burstLimit-1)
	}
}

// holdLock begins a transaction on pool that takes a lock with sql (a
// row's FOR UPDATE, an advisory lock) and holds it until the caller rolls
// it back, or the test ends.
func holdLock(ctx context.Context, t *testing.T, pool *pgxpool.Pool, sql string, args ...any) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		t.Fatal(err)
	}
	return tx
}

// waitForLockWaiters returns once decisions on this test binary's schema
// wait for a lock: at least want of them, or at least one after 3 s.
func waitForLockWaiters(ctx context.Context, t *testing.T, admin *pgxpool.Pool, want int) {
	t.Helper()
	started := time.Now()
	for {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, pgstoretest.Schema()).Scan(&n)
		if err != nil {
			t.Error(err)
			return
		}
		if n >= want || (n > 0 && time.Since(started) > 3*time.Second) {
			return
		}
		if ctx.Err() != nil {
			t.Errorf("no decision waited for the locked table: %v", ctx.Err())
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
