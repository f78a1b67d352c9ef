package pgengine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit"

	"github.com/ratekit/ratekit/durable/internal/pgengine"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
)

func coalescingStore(t testing.TB, url string, conns int32, maxInFlight int, simple bool) (*pgengine.Store, *pgstoretest.BatchCounter) {
	t.Helper()
	tr := &pgstoretest.BatchCounter{}
	s, err := pgengine.New(pgstoretest.TracedPool(t, url, conns, tr), pgengine.Config{Schema: pgstoretest.Schema(), MaxInFlight: maxInFlight, SimpleProtocol: simple})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	return s, tr
}

// TestCoalescedDecisionsAreExact: 48 callers, each with a counter of its
// own limit, durability and commit mode, run the same script at once
// through a store that keeps one decision in flight, so almost every
// decision goes in a batch. Every result must be the one its own counter
// gives alone: a result returned to the wrong caller shows as a wrong
// Remaining.
func TestCoalescedDecisionsAreExact(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			s, tr := coalescingStore(t, pgstoretest.PostgresURL(t), 4, 1, false)
			ctx := ctxT(t)
			var wg sync.WaitGroup
			for g := 0; g < 48; g++ {
				limit := int64(3 + g)
				c := newCounter(t, s, pgengine.CounterConfig{Algorithm: alg, Quota: limit,
					Durability: pgengine.Durability(g%2 + 1), SynchronousCommit: g%3 == 0})
				wg.Add(1)
				go func() {
					defer wg.Done()
					key := fmt.Sprintf("caller-%d", g)
					check := func(step string, r pgengine.Outcome, err error, allowed bool, remaining int64, dup bool) bool {
						if err != nil || r.Allowed != allowed || r.Remaining != remaining || r.Duplicate != dup {
							t.Errorf("caller %d (limit %d), %s: %+v, %v; want allowed %v, remaining %d, duplicate %v",
								g, limit, step, r, err, allowed, remaining, dup)
							return false
						}
						return true
					}
					for i := int64(0); i < limit; i++ {
						r, err := c.Take(ctx, key, 1, "")
						if !check(fmt.Sprintf("take %d", i), r, err, true, limit-1-i, false) {
							return
						}
					}
					r, err := c.Take(ctx, key, 1, "")
					check("take over the limit", r, err, false, 0, false)
					r, err = c.Refund(ctx, key, 1, "")
					check("refund", r, err, true, 1, false)
					r, err = c.Take(ctx, key, 1, "once")
					check("take with idempotency key", r, err, true, 0, false)
					r, err = c.Take(ctx, key, 1, "once")
					check("retry with idempotency key", r, err, true, 0, true)
					r, err = c.Peek(ctx, key, 1)
					check("peek", r, err, false, 0, false)
				}()
			}
			wg.Wait()
			if tr.Batches.Load() == 0 {
				t.Fatal("no batch formed")
			}
			t.Logf("%d statements, %d batches", tr.Statements.Load(), tr.Batches.Load())
		})
	}
}

// TestCoalescedExactness is TestExactness with coalescing on and forced:
// four stores ("instances") × 64 goroutines on one key with limit 100,
// half the takes with idempotency keys that are each sent twice at once,
// directly and through PgBouncer in transaction mode, in exec mode and
// simple protocol. Exactly 100 units are admitted, each idempotency key is
// charged once, and batches must have formed.
func TestCoalescedExactness(t *testing.T) {
	for _, via := range []string{"postgres", "pgbouncer"} {
		for _, simple := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/simple=%v", via, simple), func(t *testing.T) {
				url := pgstoretest.PostgresURL(t)
				if via == "pgbouncer" {
					url = pgstoretest.PgBouncerURL(t)
				}
				var stores []*pgengine.Store
				var trs []*pgstoretest.BatchCounter
				for i := 0; i < 4; i++ {
					s, tr := coalescingStore(t, url, 4, 2, simple)
					stores, trs = append(stores, s), append(trs, tr)
				}
				ctx := ctxT(t)
				for _, alg := range algorithms {
					t.Run(alg.String(), func(t *testing.T) {
						prefix := pgstoretest.Prefix(t)
						var before int64
						for _, tr := range trs {
							before += tr.Batches.Load()
						}
						var admitted, denied, dups atomic.Int64
						var wg sync.WaitGroup
						for si, s := range stores {
							c := newCounter(t, s, pgengine.CounterConfig{Prefix: prefix, Algorithm: alg, Quota: 100, CleanupProbability: 0.05, Durability: pgengine.Unlogged})
							for g := 0; g < 64; g++ {
								for i := 0; i < 3; i++ {
									idem := ""
									if (g+i)%2 == 0 {
										idem = fmt.Sprintf("%d-%d-%d", si, g, i)
									}
									n := 1
									if idem != "" {
										n = 2 // the same idempotency key twice at once
									}
									for range n {
										wg.Add(1)
										go func() {
											defer wg.Done()
											r, err := c.Take(ctx, "shared-key", 1, idem)
											switch {
											case err != nil:
												t.Error(err)
											case r.Duplicate:
												dups.Add(1)
											case r.Allowed:
												admitted.Add(1)
											default:
												denied.Add(1)
											}
										}()
									}
								}
							}
						}
						wg.Wait()
						if admitted.Load() != 100 {
							t.Fatalf("admitted %d, denied %d, duplicates %d; want exactly 100 admitted", admitted.Load(), denied.Load(), dups.Load())
						}
						var after int64
						for _, tr := range trs {
							after += tr.Batches.Load()
						}
						if after == before {
							t.Fatal("no batch formed")
						}
						t.Logf("admitted %d, denied %d, duplicates %d, %d batches", admitted.Load(), denied.Load(), dups.Load(), after-before)
					})
				}
			})
		}
	}
}

// TestCoalescedCallerThatLeftIsNeverSent: with one decision in flight held
// up by a row lock, a queued caller whose deadline passes returns at its
// deadline, and its decision is never applied.
func TestCoalescedCallerThatLeftIsNeverSent(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 4, "")
			s, tr := coalescingStore(t, pgstoretest.PostgresURL(t), 4, 1, false)
			ctx := ctxT(t)
			c := newCounter(t, s, pgengine.CounterConfig{Algorithm: alg, Quota: 10, Durability: pgengine.Unlogged})
			if _, err := c.Take(ctx, "held", 1, ""); err != nil {
				t.Fatal(err)
			}
			// Hold the key's row (or the sliding log's advisory lock).
			lock, args := `SELECT 1 FROM "`+s.Schema()+`".counters_unlogged WHERE prefix = $1 AND key = $2 FOR UPDATE`, []any{c.Config().Prefix, []byte("held")}
			if alg == ratekit.SlidingLog {
				lock, args = "SELECT pg_advisory_xact_lock($1)", []any{pgengine.SlidingLogLockID(pgengine.Unlogged, c.Config().Prefix, "held")}
			}
			tx := holdLock(ctx, t, pool, lock, args...)
			n0 := tr.Statements.Load()
			blocked := make(chan error, 1)
			go func() {
				_, err := c.Take(ctx, "held", 1, "")
				blocked <- err
			}()
			// Wait until the blocked decision is in flight, then queue one
			// with a short deadline.
			deadline := time.Now().Add(30 * time.Second)
			for tr.Statements.Load() == n0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(50 * time.Millisecond)
			short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := c.Take(short, "left", 1, "")
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("queued take: %v, want its deadline", err)
			}
			if late := time.Since(start) - 200*time.Millisecond; late > 150*time.Millisecond {
				t.Errorf("queued take returned %v after its deadline", late)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-blocked; err != nil {
				t.Fatal(err)
			}
			r, err := c.Peek(ctx, "left", 1)
			if err != nil || r.Remaining != 10 {
				t.Fatalf("the caller that left was counted: %+v, %v", r, err)
			}
			if n := tr.Statements.Load() - n0; n != 2 || tr.Batches.Load() != 0 {
				t.Errorf("%d statements (%d batches) since the lock, want the blocked take and the peek", n, tr.Batches.Load())
			}
		})
	}
}

// TestLoneDecisionsAreNotBatched: one caller at a time never waits for a
// batch.
func TestLoneDecisionsAreNotBatched(t *testing.T) {
	s, tr := coalescingStore(t, pgstoretest.PostgresURL(t), 4, 1, false)
	ctx := ctxT(t)
	c := newCounter(t, s, pgengine.CounterConfig{Algorithm: ratekit.FixedWindow, Quota: 100, Durability: pgengine.Unlogged})
	for i := 0; i < 20; i++ {
		if _, err := c.Take(ctx, "k", 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	if tr.Batches.Load() != 0 {
		t.Fatalf("%d batches for sequential decisions", tr.Batches.Load())
	}
}
