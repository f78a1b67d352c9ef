package pgengine_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable/internal/pgengine"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
)

func TestMain(m *testing.M) { pgstoretest.Main(m) }

var algorithms = []ratekit.Algorithm{ratekit.FixedWindow, ratekit.SlidingWindow, ratekit.TokenBucket, ratekit.SlidingLog}

func newStore(t testing.TB, db pgengine.DB) *pgengine.Store {
	t.Helper()
	s, err := pgengine.New(db, pgengine.Config{Schema: pgstoretest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newCounter(t testing.TB, s *pgengine.Store, cfg pgengine.CounterConfig) *pgengine.Counter {
	t.Helper()
	if cfg.Prefix == "" {
		cfg.Prefix = pgstoretest.Prefix(t)
	}
	if cfg.Window == 0 {
		cfg.Window = 24 * time.Hour
	}
	if cfg.CleanupProbability == 0 {
		cfg.CleanupProbability = -1
	}
	c, err := s.Counter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestTakePeekRefundReset(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 4, "")
	s := newStore(t, pool)
	ctx := ctxT(t)
	for _, alg := range algorithms {
		for _, dur := range []pgengine.Durability{pgengine.Unlogged, pgengine.Logged} {
			t.Run(alg.String()+"/"+dur.String(), func(t *testing.T) {
				c := newCounter(t, s, pgengine.CounterConfig{Algorithm: alg, Quota: 5, Durability: dur})
				const key = "user-1"
				steps := []struct {
					op        string
					cost      int64
					allowed   bool
					remaining int64
				}{
					{"peek", 5, true, 5},
					{"take", 2, true, 3},
					{"take", 3, true, 0},
					{"take", 1, false, 0},
					{"peek", 1, false, 0},
					{"refund", 2, true, 2},
					{"take", 3, false, 2},
					{"take", 2, true, 0},
					{"refund", 100, true, 5},
					{"take", 4, true, 1},
				}
				for i, st := range steps {
					var r pgengine.Outcome
					var err error
					switch st.op {
					case "take":
						r, err = c.Take(ctx, key, st.cost, "")
					case "peek":
						r, err = c.Peek(ctx, key, st.cost)
					case "refund":
						r, err = c.Refund(ctx, key, st.cost, "")
					}
					if err != nil {
						t.Fatalf("step %d %s(%d): %v", i, st.op, st.cost, err)
					}
					if r.Allowed != st.allowed || r.Remaining != st.remaining {
						t.Fatalf("step %d %s(%d) = %+v, want allowed %v remaining %d", i, st.op, st.cost, r, st.allowed, st.remaining)
					}
					if r.Allowed && r.RetryAfter != 0 || !r.Allowed && r.RetryAfter <= 0 {
						t.Fatalf("step %d: RetryAfter %v with Allowed %v", i, r.RetryAfter, r.Allowed)
					}
					if r.ResetAfter < 0 || r.ResetAfter > 48*time.Hour {
						t.Fatalf("step %d: ResetAfter %v", i, r.ResetAfter)
					}
				}
				if err := c.Reset(ctx, key); err != nil {
					t.Fatal(err)
				}
				if r, err := c.Peek(ctx, key, 5); err != nil || !r.Allowed || r.Remaining != 5 {
					t.Fatalf("after reset: %+v, %v", r, err)
				}
				if _, err := c.Take(ctx, key, 6, ""); !errors.Is(err, ratekit.ErrCostExceedsQuota) {
					t.Fatalf("cost 6 of 5: %v, want ErrCostExceedsQuota", err)
				}
				if _, err := c.Take(ctx, key, 0, ""); !errors.Is(err, ratekit.ErrInvalidCost) {
					t.Fatalf("cost 0: %v, want ErrInvalidCost", err)
				}
			})
		}
	}
}

func TestRetryAfterAndWindowRollover(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 4, "")
	s := newStore(t, pool)
	ctx := ctxT(t)
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			// Long enough that a busy machine makes the four takes
			// that reach a denial within one window.
			window := time.Second
			c := newCounter(t, s, pgengine.CounterConfig{Algorithm: alg, Quota: 3, Window: window, Durability: pgengine.Unlogged})
			var denied pgengine.Outcome
			for i := 0; i < 10; i++ {
				r, err := c.Take(ctx, "k", 1, "")
				if err != nil {
					t.Fatal(err)
				}
				if !r.Allowed {
					denied = r
					break
				}
			}
			if denied.Allowed || denied.RetryAfter <= 0 {
				t.Fatalf("never denied: %+v", denied)
			}
			// The sliding window may need up to two windows to forget.
			if denied.RetryAfter > 2*window {
				t.Fatalf("RetryAfter %v exceeds two windows", denied.RetryAfter)
			}
			time.Sleep(denied.RetryAfter + 20*time.Millisecond)
			r, err := c.Take(ctx, "k", 1, "")
			if err != nil {
				t.Fatal(err)
			}
			if !r.Allowed {
				t.Fatalf("still denied after RetryAfter %v: %+v", denied.RetryAfter, r)
			}
		})
	}
}

func TestIdempotencyKey(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 4, "")
	s := newStore(t, pool)
	ctx := ctxT(t)
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			c := newCounter(t, s, pgengine.CounterConfig{Algorithm: alg, Quota: 3, Durability: pgengine.Unlogged})
			r, err := c.Take(ctx, "k", 2, "invocation-1")
			if err != nil || !r.Allowed || r.Duplicate || r.Remaining != 1 {
				t.Fatalf("first: %+v, %v", r, err)
			}
			for i := 0; i < 3; i++ {
				r, err = c.Take(ctx, "k", 2, "invocation-1")
				if err != nil || !r.Allowed || !r.Duplicate || r.Remaining != 1 {
					t.Fatalf("retry %d: %+v, %v", i, r, err)
				}
			}
			// A denied request records nothing: its retry is judged afresh.
			if r, err = c.Take(ctx, "k", 2, "invocation-2"); err != nil || r.Allowed {
				t.Fatalf("over quota: %+v, %v", r, err)
			}
			if r, err = c.Refund(ctx, "k", 1, "refund-1"); err != nil || r.Remaining != 2 {
				t.Fatalf("refund: %+v, %v", r, err)
			}
			if r, err = c.Refund(ctx, "k", 1, "refund-1"); err != nil || !r.Duplicate || r.Remaining != 2 {
				t.Fatalf("refund retry: %+v, %v", r, err)
			}
			if r, err = c.Take(ctx, "k", 2, "invocation-2"); err != nil || !r.Allowed || r.Duplicate {
				t.Fatalf("retry of denied request: %+v, %v", r, err)
			}
			// The same idempotency key on another request key is another
			// request.
			if r, err = c.Take(ctx, "other", 1, "invocation-1"); err != nil || r.Duplicate {
				t.Fatalf("other key: %+v, %v", r, err)
			}
		})
	}
}

// TestIdempotencyAfterRefund is the paid-call cycle: a call is charged, its
// downstream work fails and it is refunded, and the client retries with the
// same idempotency key. The retry must be charged again (not waved through as
// a duplicate of a charge that was given back), and its refund must work too.
func TestIdempotencyAfterRefund(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 4, "")
	s := newStore(t, pool)
	ctx := ctxT(t)
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			c := newCounter(t, s, pgengine.CounterConfig{Algorithm: alg, Quota: 5, Durability: pgengine.Unlogged})
			step := func(name string, op func(context.Context, string, int64, string) (pgengine.Outcome, error), wantDup bool, wantRemaining int64) {
				t.Helper()
				r, err := op(ctx, "k", 1, "call-7")
				if err != nil || !r.Allowed || r.Duplicate != wantDup || r.Remaining != wantRemaining {
					t.Fatalf("%s: %+v, %v; want duplicate=%v remaining=%d", name, r, err, wantDup, wantRemaining)
				}
			}
			step("charge", c.Take, false, 4)
			step("refund after the failure", c.Refund, false, 5)
			step("retry with the same key is charged again", c.Take, false, 4)
			step("retry of that retry is a duplicate", c.Take, true, 4)
			step("its refund is not a duplicate", c.Refund, false, 5)
			step("a repeated refund is", c.Refund, true, 5)
		})
	}
}

// TestIdempotencyConcurrent sends the same invocation from many goroutines
// at once: exactly one takes.
func TestIdempotencyConcurrent(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 8, "")
	s := newStore(t, pool)
	ctx := ctxT(t)
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			c := newCounter(t, s, pgengine.CounterConfig{Algorithm: alg, Quota: 10, Durability: pgengine.Unlogged})
			var wg sync.WaitGroup
			var fresh, dup atomic.Int64
			for i := 0; i < 32; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r, err := c.Take(ctx, "k", 1, "same")
					if err != nil {
						t.Error(err)
						return
					}
					if r.Duplicate {
						dup.Add(1)
					} else if r.Allowed {
						fresh.Add(1)
					}
				}()
			}
			wg.Wait()
			if fresh.Load() != 1 || dup.Load() != 31 {
				t.Fatalf("fresh %d, duplicate %d; want 1 and 31", fresh.Load(), dup.Load())
			}
			if r, err := c.Peek(ctx, "k", 1); err != nil || r.Remaining != 9 {
				t.Fatalf("peek: %+v, %v", r, err)
			}
		})
	}
}

// TestExactness is the test: four pools ("instances") × 64
// goroutines against one key with limit 100, directly and through PgBouncer
// in transaction mode.
func TestExactness(t *testing.T) {
	for _, via := range []string{"postgres", "pgbouncer"} {
		t.Run(via, func(t *testing.T) {
			url := pgstoretest.PostgresURL(t)
			if via == "pgbouncer" {
				url = pgstoretest.PgBouncerURL(t)
			}
			var stores []*pgengine.Store
			for i := 0; i < 4; i++ {
				stores = append(stores, newStore(t, pgstoretest.Pool(t, url, 4, "")))
			}
			ctx := ctxT(t)
			for _, alg := range algorithms {
				t.Run(alg.String(), func(t *testing.T) {
					prefix := pgstoretest.Prefix(t)
					var counters []*pgengine.Counter
					for _, s := range stores {
						counters = append(counters, newCounter(t, s, pgengine.CounterConfig{
							Prefix: prefix, Algorithm: alg, Quota: 100, CleanupProbability: 0.05, Durability: pgengine.Unlogged,
						}))
					}
					const perGoroutine = 3
					var admitted, denied atomic.Int64
					var wg sync.WaitGroup
					for _, c := range counters {
						for g := 0; g < 64; g++ {
							wg.Add(1)
							go func() {
								defer wg.Done()
								for i := 0; i < perGoroutine; i++ {
									r, err := c.Take(ctx, "shared-key", 1, "")
									if err != nil {
										t.Error(err)
										return
									}
									if r.Allowed {
										admitted.Add(1)
									} else {
										denied.Add(1)
									}
								}
							}()
						}
					}
					wg.Wait()
					// The window is a day and the refill 100 per day, so
					// every algorithm's bound is the limit itself here.
					if admitted.Load() != 100 || denied.Load() != 4*64*perGoroutine-100 {
						t.Fatalf("admitted %d, denied %d; want exactly 100 admitted", admitted.Load(), denied.Load())
					}
					if r, err := counters[0].Peek(ctx, "shared-key", 1); err != nil || r.Allowed || r.Remaining != 0 {
						t.Fatalf("peek after: %+v, %v", r, err)
					}
				})
			}
		})
	}
}

// TestSlidingLogRollingWindow checks the sliding log's guarantee over time:
// in every rolling window no more than the limit was admitted.
func TestSlidingLogRollingWindow(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 8, "")
	s := newStore(t, pool)
	ctx := ctxT(t)
	const limit, window = 5, 400 * time.Millisecond
	c := newCounter(t, s, pgengine.CounterConfig{Algorithm: ratekit.SlidingLog, Quota: limit, Window: window, Durability: pgengine.Unlogged})
	var mu sync.Mutex
	var times []time.Time
	var wg sync.WaitGroup
	// 1.5 s, and longer, up to 20 s, until twice the limit was admitted:
	// a busy machine may make few decisions in 1.5 s.
	start := time.Now()
	end, giveUp := start.Add(1500*time.Millisecond), start.Add(20*time.Second)
	going := func() bool {
		mu.Lock()
		enough := len(times) >= 2*limit
		mu.Unlock()
		now := time.Now()
		return now.Before(end) || (!enough && now.Before(giveUp))
	}
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for going() {
				r, err := c.Take(ctx, "k", 1, "")
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					mu.Lock()
					times = append(times, time.Now())
					mu.Unlock()
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	if len(times) < 2*limit {
		t.Fatalf("only %d admissions in %v", len(times), time.Since(start).Round(time.Millisecond))
	}
	// Client-side timestamps are taken after the decision returns, so a
	// window measured here can only look shorter than the database's; use
	// the database's own rows for the exact check.
	rows, err := pool.Query(ctx, `SELECT at_us FROM "`+s.Schema()+`".log_unlogged WHERE prefix = $1 ORDER BY at_us`, c.Config().Prefix)
	if err != nil {
		t.Fatal(err)
	}
	ats, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	for i := range ats {
		n := 0
		for j := i; j < len(ats) && ats[j]-ats[i] < window.Microseconds(); j++ {
			n++
		}
		if n > limit {
			t.Fatalf("%d admissions within %v starting at row %d", n, window, i)
		}
	}
}

// TestSynchronousCommit: a decision on logged tables turns
// synchronous_commit off for its transaction unless SynchronousCommit is
// set; one on unlogged tables (which write no WAL, so never wait for a
// flush) leaves it alone, in a caller's own transaction too. Composites
// follow the same rule.
func TestSynchronousCommit(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 2, "")
	ctx := ctxT(t)
	newStore(t, pool).Migrate(ctx)
	for _, tc := range []struct {
		durability pgengine.Durability
		sync       bool
		composite  bool
		want       string
	}{
		{pgengine.Logged, false, false, "off"},
		{pgengine.Logged, true, false, "on"},
		{pgengine.Unlogged, false, false, "on"},
		{pgengine.Logged, false, true, "off"},
		{pgengine.Logged, true, true, "on"},
		{pgengine.Unlogged, false, true, "on"},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		s := newStore(t, tx)
		c := newCounter(t, s, pgengine.CounterConfig{Algorithm: ratekit.FixedWindow, Quota: 5, Durability: tc.durability, SynchronousCommit: tc.sync})
		if tc.composite {
			comp, err := pgengine.NewComposite(c)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := comp.Take(ctx, "k", 1, nil, ""); err != nil {
				t.Fatal(err)
			}
		} else if _, err := c.Take(ctx, "k", 1, ""); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("%+v: synchronous_commit in the decision's transaction is %q, want %q", tc, got, tc.want)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		// SET LOCAL ends with the transaction: the session keeps its own.
		if err := pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&got); err != nil || got != "on" {
			t.Fatalf("session synchronous_commit after the transaction: %q, %v", got, err)
		}
	}
}

func TestBadInput(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 4, "")
	s := newStore(t, pool)
	ctx := ctxT(t)
	c := newCounter(t, s, pgengine.CounterConfig{Algorithm: ratekit.FixedWindow, Quota: 1, Durability: pgengine.Unlogged})
	keys := []string{
		"o'brien", `back\slash`, `"double"`, "a\x00b", "a", "a\x00", "\xff\xfe\xfd", "\xc3\x28",
		"'); DROP TABLE counters; --", "$1", "日本語", strings.Repeat("k", ratekit.MaxKeyLen),
	}
	for _, k := range keys {
		r, err := c.Take(ctx, k, 1, "idem'\x00\xff")
		if err != nil {
			t.Fatalf("key %q: %v", k, err)
		}
		if !r.Allowed {
			t.Fatalf("key %q collided with an earlier key: %+v", k, r)
		}
	}
	// Each key is stored exactly as given: each is now at its limit.
	for _, k := range keys {
		if r, err := c.Take(ctx, k, 1, ""); err != nil || r.Allowed {
			t.Fatalf("second take of %q: %+v, %v", k, r, err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+s.Schema()+`".counters_unlogged WHERE prefix = $1`, c.Config().Prefix).Scan(&n); err != nil || n != len(keys) {
		t.Fatalf("rows for prefix: %d, %v; want %d", n, err, len(keys))
	}
	if _, err := c.Take(ctx, strings.Repeat("k", 10_000), 1, ""); !errors.Is(err, ratekit.ErrKeyTooLong) {
		t.Fatalf("10 kB key: %v", err)
	}
	if _, err := c.Take(ctx, "k", 1, strings.Repeat("i", 10_000)); !errors.Is(err, ratekit.ErrKeyTooLong) {
		t.Fatalf("10 kB idempotency key: %v", err)
	}
	if _, err := c.Take(ctx, "", 1, ""); !errors.Is(err, ratekit.ErrEmptyKey) {
		t.Fatalf("empty key: %v", err)
	}
	if err := c.Reset(ctx, strings.Repeat("k", 10_000)); !errors.Is(err, ratekit.ErrKeyTooLong) {
		t.Fatalf("reset 10 kB key: %v", err)
	}
	for _, p := range []string{"x'; DROP TABLE ratekit.counters; --", "a b", "", strings.Repeat("p", 65), "ü"} {
		if _, err := s.Counter(pgengine.CounterConfig{Prefix: p, Algorithm: ratekit.FixedWindow, Quota: 1, Window: time.Second, Durability: pgengine.Unlogged}); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("prefix %q: %v, want ErrInvalidConfig", p, err)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 1, "")
	s := newStore(t, pool)
	ok := pgengine.CounterConfig{Prefix: "p", Algorithm: ratekit.FixedWindow, Quota: 1, Window: time.Second, Durability: pgengine.Unlogged}
	bad := map[string]func(*pgengine.CounterConfig){
		"no algorithm":    func(c *pgengine.CounterConfig) { c.Algorithm = 0 },
		"bad durability":  func(c *pgengine.CounterConfig) { c.Durability = 7 },
		"zero limit":      func(c *pgengine.CounterConfig) { c.Quota = 0 },
		"huge limit":      func(c *pgengine.CounterConfig) { c.Quota = 1 << 62 },
		"short window":    func(c *pgengine.CounterConfig) { c.Window = time.Microsecond },
		"probability > 1": func(c *pgengine.CounterConfig) { c.CleanupProbability = 1.5 },
		"negative batch":  func(c *pgengine.CounterConfig) { c.CleanupBatch = -1 },
		"prefix with ';'": func(c *pgengine.CounterConfig) { c.Prefix = "a;b" },
	}
	for name, mutate := range bad {
		cfg := ok
		mutate(&cfg)
		if _, err := s.Counter(cfg); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := s.Counter(ok); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", "Upper", "1abc", "a-b", `a"b`, strings.Repeat("a", 64)} {
		if _, err := pgengine.New(pool, pgengine.Config{Schema: name}); name != "" && !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("schema %q: %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := pgengine.New(nil, pgengine.Config{}); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Errorf("nil DB: %v", err)
	}
}

// freshSchema returns the name of a schema that does not exist yet, dropped
// when t ends.
func freshSchema(t *testing.T) string {
	t.Helper()
	schema := pgstoretest.NewSchema()
	t.Cleanup(func() {
		if err := pgstoretest.Drop(schema); err != nil {
			t.Error(err)
		}
	})
	return schema
}

// TestMigrateRace starts many cold "instances" at once on a schema that does
// not exist yet: all of them must succeed.
func TestMigrateRace(t *testing.T) {
	url := pgstoretest.PostgresURL(t)
	schema := freshSchema(t)
	ctx := ctxT(t)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		pool := pgstoretest.Pool(t, url, 1, "")
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := pgengine.New(pool, pgengine.Config{Schema: schema})
			if err != nil {
				t.Error(err)
				return
			}
			c, err := s.Counter(pgengine.CounterConfig{Prefix: "race", Algorithm: ratekit.SlidingLog, Quota: 100, Window: time.Hour, Durability: pgengine.Unlogged})
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := c.Take(ctx, "k", 1, ""); err != nil {
				t.Errorf("cold start: %v", err)
			}
		}()
	}
	wg.Wait()
	pool := pgstoretest.Pool(t, url, 1, "")
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".log_unlogged`).Scan(&n); err != nil || n != 8 {
		t.Fatalf("log rows: %d, %v", n, err)
	}
}

// TestMigrateFindsAMigrationThatCommittedWhileItWaited is a cold start that
// finds no schema, then waits for the migration lock while another instance
// creates the schema. Once it holds the lock it must see that commit and do
// nothing: running the DDL again takes table locks that deadlock with the
// other instance's first decisions (TestMigrateRace, under load).
func TestMigrateFindsAMigrationThatCommittedWhileItWaited(t *testing.T) {
	url := pgstoretest.PostgresURL(t)
	schema := freshSchema(t)
	ctx := ctxT(t)
	// The first instance's one connection holds the migration lock for the
	// session, so that its own migration (which takes the same lock again)
	// runs while the second instance waits.
	first := pgstoretest.Pool(t, url, 1, "")
	if _, err := first.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(pgengine.MigrationLockID)); err != nil {
		t.Fatal(err)
	}
	second, err := pgengine.New(pgstoretest.Pool(t, url, 1, ""), pgengine.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- second.Migrate(ctx) }()
	// The second migration has found no schema and waits for the lock.
	lock := uint64(pgengine.MigrationLockID)
	for {
		var waiting bool
		err := first.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1)`,
			int64(lock>>32), int64(uint32(lock))).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the second migration did not wait for the lock: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	s, err := pgengine.New(first, pgengine.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// The migration drops and creates the functions, which gives them new
	// OIDs.
	const functions = `SELECT array_agg(p.oid::bigint ORDER BY p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1`
	var before, after []int64
	if err := first.QueryRow(ctx, functions, schema).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Exec(ctx, "SELECT pg_advisory_unlock($1)", int64(pgengine.MigrationLockID)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("second migration: %v", err)
	}
	if err := first.QueryRow(ctx, functions, schema).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(before, after) {
		t.Errorf("the second migration created the schema again: its functions were %v, then %v", before, after)
	}
}

func TestDisableAutoMigrate(t *testing.T) {
	url := pgstoretest.PostgresURL(t)
	pool := pgstoretest.Pool(t, url, 1, "")
	schema := pgstoretest.NewSchema()
	t.Cleanup(func() { pgstoretest.Drop(schema) })
	ctx := ctxT(t)
	s, err := pgengine.New(pool, pgengine.Config{Schema: schema, DisableAutoMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Counter(pgengine.CounterConfig{Prefix: "p", Algorithm: ratekit.FixedWindow, Quota: 1, Window: time.Second, Durability: pgengine.Unlogged})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Take(ctx, "k", 1, ""); err == nil {
		t.Fatal("Take succeeded without a schema")
	}
	ddl, err := pgengine.SchemaSQL(schema)
	if err != nil {
		t.Fatal(err)
	}
	// The exported SQL is what a migration tool runs (simple protocol,
	// several statements).
	if _, err := pool.Exec(ctx, ddl, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Take(ctx, "k", 1, ""); err != nil || !r.Allowed {
		t.Fatalf("after migration: %+v, %v", r, err)
	}
}

func TestCleanup(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 2, "")
	s := newStore(t, pool)
	ctx := ctxT(t)
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			prefix := pgstoretest.Prefix(t)
			c := newCounter(t, s, pgengine.CounterConfig{Prefix: prefix, Algorithm: alg, Quota: 2, Window: 50 * time.Millisecond, CleanupBatch: 3, Durability: pgengine.Unlogged})
			// Another prefix with a long window must survive.
			other := newCounter(t, s, pgengine.CounterConfig{Algorithm: alg, Quota: 2, Durability: pgengine.Unlogged})
			for i := 0; i < 10; i++ {
				if _, err := c.Take(ctx, fmt.Sprint("k", i), 1, fmt.Sprint("i", i)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := other.Take(ctx, "k", 1, "i"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(150 * time.Millisecond)
			n, err := c.Cleanup(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// 10 counters (or log entries) and 10 idempotency records.
			if n != 20 {
				t.Fatalf("Cleanup deleted %d rows, want 20", n)
			}
			if n, err := c.Cleanup(ctx); err != nil || n != 0 {
				t.Fatalf("second Cleanup: %d, %v", n, err)
			}
			if r, err := other.Peek(ctx, "k", 2); err != nil || r.Allowed {
				t.Fatalf("other prefix lost its state: %+v, %v", r, err)
			}
		})
	}
}

func TestInlineCleanup(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 2, "")
	s := newStore(t, pool)
	ctx := ctxT(t)
	prefix := pgstoretest.Prefix(t)
	c := newCounter(t, s, pgengine.CounterConfig{Prefix: prefix, Algorithm: ratekit.FixedWindow, Quota: 2, Window: 20 * time.Millisecond, CleanupProbability: 1, Durability: pgengine.Unlogged})
	for i := 0; i < 20; i++ {
		if _, err := c.Take(ctx, fmt.Sprint("k", i), 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(80 * time.Millisecond)
	if _, err := c.Take(ctx, "last", 1, ""); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+s.Schema()+`".counters_unlogged WHERE prefix = $1`, prefix).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows after inline cleanup: %d, %v; want 1", n, err)
	}
}

// TestCleanupIgnoresStaleStatistics: the planner estimates expired rows from
// the histogram of the table's last ANALYZE; once the clock has passed its
// last bucket, it takes every row of the prefix for expired. A cleanup, inline
// or scheduled, must still find expired rows through the expiry index rather
// than scan the whole table while its decision holds a key's lock.
func TestCleanupIgnoresStaleStatistics(t *testing.T) {
	for _, alg := range []ratekit.Algorithm{ratekit.FixedWindow, ratekit.SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			pool, s, schema := soleSessionStore(t)
			ctx := ctxT(t)
			c := newCounter(t, s, pgengine.CounterConfig{Prefix: "p", Algorithm: alg, Quota: 10, Window: pgengine.FarWindow, CleanupProbability: 1, Durability: pgengine.Unlogged})
			if _, err := c.Peek(ctx, "k", 1); err != nil { // migrates
				t.Fatal(err)
			}
			q := `"` + schema + `".`
			// 20,000 rows of the prefix in every table, analysed while
			// all of them look expired, then renewed without a new
			// ANALYZE; and one row in each that is expired.
			execAll(t, pool, fillRows(q, "1")...)
			for _, table := range statTables {
				execAll(t, pool, `ALTER TABLE `+q+table+` SET (autovacuum_enabled = false)`)
			}
			execAll(t, pool, analyze(q))
			for _, table := range statTables {
				execAll(t, pool, `UPDATE `+q+table+` SET expires_at_us = 4611686018427387904`)
			}
			execAll(t, pool, oldRows(q)...)
			expired := func() (n int64) {
				t.Helper()
				err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+q+`counters_unlogged WHERE key = 'old') + (SELECT count(*) FROM `+q+`log_unlogged WHERE key = 'old') + (SELECT count(*) FROM `+q+`idempotency_unlogged WHERE key = 'old')`).Scan(&n)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			before := seqScans(t, pool, schema)
			if r, err := c.Take(ctx, "k", 1, "x"); err != nil || !r.Allowed {
				t.Fatalf("take: %+v, %v", r, err)
			}
			if got := seqScans(t, pool, schema); !slices.Equal(got, before) {
				t.Errorf("inline cleanup: sequential scans of %v went from %v to %v", statTables, before, got)
			}
			if n := expired(); n != 0 {
				t.Fatalf("%d expired rows left by the inline cleanup, want 0", n)
			}
			execAll(t, pool, oldRows(q)[:2]...)
			before = seqScans(t, pool, schema)
			if n, err := c.Cleanup(ctx); err != nil || n != 2 {
				t.Fatalf("Cleanup: %d, %v; want 2", n, err)
			}
			if got := seqScans(t, pool, schema); !slices.Equal(got, before) {
				t.Errorf("Cleanup: sequential scans of %v went from %v to %v", statTables, before, got)
			}
		})
	}
}

// TestDecisionsIgnoreStaleStatistics: a decision function's statements are
// planned once per session and kept. Planned while the tables were tiny (as
// analysed), a look-up by key would stay a scan of the whole table as the
// table grows, until the next ANALYZE; every decision must use the indexes
// whatever the statistics say.
func TestDecisionsIgnoreStaleStatistics(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			pool, s, schema := soleSessionStore(t)
			ctx := ctxT(t)
			c := newCounter(t, s, pgengine.CounterConfig{Prefix: "p", Algorithm: alg, Quota: 1000, Window: pgengine.FarWindow, Durability: pgengine.Unlogged})
			q := `"` + schema + `".`
			decide := func(n int) {
				t.Helper()
				for i := range n {
					if r, err := c.Take(ctx, "k", 1, fmt.Sprint("t", i)); err != nil || !r.Allowed {
						t.Fatalf("take: %+v, %v", r, err)
					}
					if _, err := c.Refund(ctx, "k", 1, fmt.Sprint("r", i)); err != nil {
						t.Fatalf("refund: %v", err)
					}
					if _, err := c.Peek(ctx, "k", 1); err != nil {
						t.Fatalf("peek: %v", err)
					}
				}
			}
			decide(1)
			// Analysed while tiny, then used often enough for the
			// sessions' plans to settle.
			execAll(t, pool, analyze(q))
			decide(10)
			execAll(t, pool, fillRows(q, "4611686018427387904")...)
			before := seqScans(t, pool, schema)
			decide(3)
			if got := seqScans(t, pool, schema); !slices.Equal(got, before) {
				t.Errorf("sequential scans of %v went from %v to %v", statTables, before, got)
			}
		})
	}
}

// soleSessionStore returns a pool of one connection, a Store on it and the
// Store's schema, a fresh one dropped when t ends. With one connection the
// plans a test relies on are cached in the session it measures, and the
// statistics it reads are flushed by the backend that wrote them.
func soleSessionStore(t *testing.T) (*pgxpool.Pool, *pgengine.Store, string) {
	t.Helper()
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 1, "")
	schema := pgstoretest.NewSchema()
	t.Cleanup(func() { pgstoretest.Drop(schema) })
	s, err := pgengine.New(pool, pgengine.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return pool, s, schema
}

// statTables are the tables of unlogged counters that the stale-statistics
// tests fill and watch.
var statTables = []string{"counters_unlogged", "log_unlogged", "idempotency_unlogged"}

// fillRows returns the statements that add 20,000 rows of prefix p,
// expiring at expires (microseconds), to each of statTables under q (the
// quoted schema and a dot).
func fillRows(q, expires string) []string {
	return []string{
		`INSERT INTO ` + q + `counters_unlogged (prefix, key, expires_at_us) SELECT 'p', convert_to('f' || i, 'UTF8'), ` + expires + ` FROM generate_series(1, 20000) AS i`,
		`INSERT INTO ` + q + `log_unlogged (prefix, key, at_us, cost, expires_at_us) SELECT 'p', convert_to('f' || i, 'UTF8'), 1, 1, ` + expires + ` FROM generate_series(1, 20000) AS i`,
		`INSERT INTO ` + q + `idempotency_unlogged (prefix, key, idempotency_key, expires_at_us) SELECT 'p', convert_to('f' || i, 'UTF8'), '\x74', ` + expires + ` FROM generate_series(1, 20000) AS i`,
	}
}

// oldRows returns the statements that add one expired row of key "old" and
// prefix p to each of statTables under q.
func oldRows(q string) []string {
	return []string{
		`INSERT INTO ` + q + `counters_unlogged (prefix, key, expires_at_us) VALUES ('p', 'old', 2)`,
		`INSERT INTO ` + q + `log_unlogged (prefix, key, at_us, cost, expires_at_us) VALUES ('p', 'old', 1, 1, 2)`,
		`INSERT INTO ` + q + `idempotency_unlogged (prefix, key, idempotency_key, expires_at_us) VALUES ('p', 'old', '\x74', 2)`,
	}
}

// analyze returns the statement that analyses statTables under q.
func analyze(q string) string { return "ANALYZE " + q + strings.Join(statTables, ", "+q) }

// execAll runs stmts on pool in order.
func execAll(t *testing.T, pool *pgxpool.Pool, stmts ...string) {
	t.Helper()
	for _, stmt := range stmts {
		if _, err := pool.Exec(ctxT(t), stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
}

// seqScans returns the sequential scans of each of statTables in schema so
// far, after flushing the statistics of pool's connection (pool must have
// one).
func seqScans(t *testing.T, pool *pgxpool.Pool, schema string) []int64 {
	t.Helper()
	ctx := ctxT(t)
	if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	n := make([]int64, len(statTables))
	for i, table := range statTables {
		if err := pool.QueryRow(ctx, `SELECT seq_scan FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`, schema, table).Scan(&n[i]); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func TestSimpleProtocolThroughPgBouncer(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PgBouncerURL(t), 2, "")
	s, err := pgengine.New(pool, pgengine.Config{Schema: pgstoretest.Schema(), SimpleProtocol: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	for _, alg := range algorithms {
		c := newCounter(t, s, pgengine.CounterConfig{Algorithm: alg, Quota: 2, Durability: pgengine.Unlogged})
		for i, want := range []bool{true, true, false} {
			r, err := c.Take(ctx, "o'k\x00\xff", 1, "")
			if err != nil || r.Allowed != want {
				t.Fatalf("%v take %d: %+v, %v", alg, i, r, err)
			}
		}
	}
}

var _ pgengine.DB = (*pgxpool.Pool)(nil)
var _ pgengine.DB = (pgx.Tx)(nil)

// TestResetFunctionRefusesMalformedArrays calls the schema's reset function
// directly with arrays a Counter never sends: empty ones, and ones of
// different lengths. It refuses them with SQLSTATE 22023 and deletes
// nothing.
func TestResetFunctionRefusesMalformedArrays(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 2, "")
	s := newStore(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := pgstoretest.Prefix(t)
	c := newCounter(t, s, pgengine.CounterConfig{Prefix: prefix, Algorithm: ratekit.FixedWindow, Quota: 5, Durability: pgengine.Logged})
	if _, err := c.Take(ctx, "k", 2, ""); err != nil {
		t.Fatal(err)
	}
	q := `SELECT "` + pgstoretest.Schema() + `".reset($1::text[], $2::bytea, $3::bigint[], $4::bigint[])`
	for _, tc := range []struct {
		name        string
		prefixes    []string
		algs, locks []int64
	}{
		{"empty", []string{}, []int64{}, []int64{}},
		{"fewer algorithms", []string{prefix}, []int64{}, []int64{0}},
		{"more locks", []string{prefix}, []int64{1}, []int64{0, 0}},
	} {
		_, err := pool.Exec(ctx, q, tc.prefixes, []byte("k"), tc.algs, tc.locks)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "22023" {
			t.Errorf("%s: %v, want SQLSTATE 22023", tc.name, err)
		}
	}
	if r, err := c.Peek(ctx, "k", 1); err != nil || r.Remaining != 3 {
		t.Fatalf("after the refused resets: %+v, %v; want remaining 3", r, err)
	}
}

// TestSlidingWindowWeighsThePreviousWindow: early in a window, the previous
// window's admissions still count (weighted by the part of it that the
// rolling window covers), and a take that admits keeps them for the takes
// after it. With a quota of 10 filled in one 2 s window, the first take
// 250 ms into the next sees an estimate of 8.75 and is admitted; the
// second, before 400 ms, sees more than 8 + 1 and must be denied.
func TestSlidingWindowWeighsThePreviousWindow(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 2, "")
	ctx := ctxT(t)
	s := newStore(t, pool)
	const window = 2 * time.Second
	c := newCounter(t, s, pgengine.CounterConfig{Algorithm: ratekit.SlidingWindow, Quota: 10, Window: window, Durability: pgengine.Unlogged})
	// The functions' windows are aligned to the Unix epoch on the
	// server's clock, here the same machine's.
	intoNextWindow := func(phase time.Duration) {
		time.Sleep(time.Until(time.Now().Truncate(window).Add(window + phase)))
	}
	for attempt := 0; ; attempt++ {
		key := fmt.Sprintf("k%d", attempt)
		intoNextWindow(50 * time.Millisecond)
		start := time.Now()
		for i := range 10 {
			o, err := c.Take(ctx, key, 1, "")
			if err != nil || !o.Allowed {
				t.Fatalf("take %d in the first window: %+v, %v", i, o, err)
			}
		}
		filled := time.Now()
		intoNextWindow(250 * time.Millisecond)
		first, err := c.Take(ctx, key, 1, "")
		if err != nil {
			t.Fatal(err)
		}
		second, err := c.Take(ctx, key, 1, "")
		if err != nil {
			t.Fatal(err)
		}
		late := time.Since(time.Now().Truncate(window))
		if filled.Truncate(window) != start.Truncate(window) || late >= 400*time.Millisecond {
			// The machine was too slow for the timing this relies on.
			if attempt < 4 {
				continue
			}
			t.Fatalf("could not run the takes within their windows in %d attempts (the last second take came %v into its window)", attempt+1, late)
		}
		if !first.Allowed || second.Allowed {
			t.Fatalf("early in the next window: first take %+v (want admitted), second %+v (want denied: the previous window still weighs more than 8)", first, second)
		}
		return
	}
}
