package durable_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/internal/testenv"
)

// TestMain checks for leaked goroutines (every pool is closed by its test's
// cleanup, and the limiter starts none of its own) and drops the schema.
func TestMain(m *testing.M) { pgstoretest.Main(m, testenv.CheckLeaks) }

func newStore(t testing.TB, url string, conns int32) *pgstore.Store {
	t.Helper()
	s, err := pgstore.New(pgstoretest.Pool(t, url, conns, ""), pgstore.Config{Schema: pgstoretest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var algorithms = []ratekit.Algorithm{ratekit.FixedWindow, ratekit.SlidingWindow, ratekit.TokenBucket, ratekit.SlidingLog}

func TestLimiterContract(t *testing.T) {
	s := newStore(t, pgstoretest.PostgresURL(t), 4)
	ctx := ctxT(t)
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			policy := ratekit.Policy{Name: "api", Quota: 3, Window: farWindow, Algorithm: alg}
			l, err := durable.New(durable.Config{Store: s, Policy: policy, Prefix: pgstoretest.Prefix(t), Durability: durable.Logged})
			if err != nil {
				t.Fatal(err)
			}
			req := ratekit.Request{Key: "customer-7", Cost: 1}
			for i := 0; i < 3; i++ {
				d, err := l.Allow(ctx, req)
				if err != nil || !d.Allowed || d.Remaining != int64(2-i) || d.Quota != 3 || d.Policy != policy || d.RetryAfter != 0 {
					t.Fatalf("allow %d: %+v, %v", i, d, err)
				}
			}
			d, err := l.Allow(ctx, req)
			if err != nil || d.Allowed || d.RetryAfter <= 0 || d.ResetAfter < d.RetryAfter && alg != ratekit.SlidingWindow {
				t.Fatalf("over quota: %+v, %v", d, err)
			}
			if d, err := l.Peek(ctx, req); err != nil || d.Allowed {
				t.Fatalf("peek: %+v, %v", d, err)
			}
			if d, err := l.Refund(ctx, req); err != nil || !d.Allowed || d.Remaining != 1 {
				t.Fatalf("refund: %+v, %v", d, err)
			}
			if err := l.Reset(ctx, req.Key); err != nil {
				t.Fatal(err)
			}
			if d, err := l.Peek(ctx, ratekit.Request{Key: req.Key, Cost: 3}); err != nil || !d.Allowed || d.Remaining != 3 {
				t.Fatalf("after reset: %+v, %v", d, err)
			}
			for _, bad := range []ratekit.Request{{Key: "", Cost: 1}, {Key: "k", Cost: 0}, {Key: "k", Cost: 4}} {
				if _, err := l.Allow(ctx, bad); !errors.Is(err, ratekit.ErrInvalidRequest) {
					t.Errorf("Allow(%+v): %v, want ErrInvalidRequest", bad, err)
				}
			}
			if err := l.Reset(ctx, ""); !errors.Is(err, ratekit.ErrEmptyKey) {
				t.Errorf("Reset(\"\"): %v", err)
			}
		})
	}
}

func TestTokenBucketBurst(t *testing.T) {
	s := newStore(t, pgstoretest.PostgresURL(t), 2)
	ctx := ctxT(t)
	// Burst 5 refilled at 10 a second: Quota 5 per 500ms.
	l, err := durable.New(durable.Config{Store: s,
		Policy: ratekit.Policy{Name: "burst", Quota: 5, Window: 500 * time.Millisecond, Algorithm: ratekit.TokenBucket}, Prefix: pgstoretest.Prefix(t), Durability: durable.Unlogged})
	if err != nil {
		t.Fatal(err)
	}
	// One unit refills every 6 s: on a busy machine the loop may take a
	// while, and what refilled meanwhile is counted from its duration.
	const refill = 6 * time.Second
	n := 0
	start := time.Now()
	for i := 0; i < 8; i++ {
		d, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		if d.Quota != 5 {
			t.Fatalf("Quota %d, want the burst 5", d.Quota)
		}
		if d.Allowed {
			n++
		} else if d.RetryAfter <= 0 || d.RetryAfter > refill {
			t.Fatalf("RetryAfter %v; one unit refills in %v", d.RetryAfter, refill)
		}
	}
	// Five at once, plus at most what refilled while the loop ran (10 per
	// second, one unit every 100ms) on a machine of any load.
	refilled := int(time.Since(start) / (100 * time.Millisecond))
	if n < 5 || n > 5+refilled {
		t.Fatalf("admitted %d of 8 requests with burst 5 in %v (%d refilled)", n, time.Since(start), refilled)
	}
}

func TestConfigErrors(t *testing.T) {
	s := newStore(t, pgstoretest.PostgresURL(t), 1)
	good := durable.Config{Store: s, Policy: ratekit.Policy{Name: "p", Quota: 1, Window: time.Second, Algorithm: ratekit.FixedWindow}, Durability: durable.Unlogged}
	for name, mutate := range map[string]func(*durable.Config){
		"nil store":      func(c *durable.Config) { c.Store = nil },
		"zero store":     func(c *durable.Config) { c.Store = &pgstore.Store{} },
		"durability":     func(c *durable.Config) { c.Durability = durable.Logged + 1 },
		"no durability":  func(c *durable.Config) { c.Durability = 0 },
		"bad name":       func(c *durable.Config) { c.Policy.Name = "a b" },
		"zero quota":     func(c *durable.Config) { c.Policy.Quota = 0 },
		"zero window":    func(c *durable.Config) { c.Policy.Window = 0 },
		"sql prefix":     func(c *durable.Config) { c.Prefix = "p'; DROP SCHEMA ratekit CASCADE; --" },
		"no algorithm":   func(c *durable.Config) { c.Policy.Algorithm = 0 },
		"negative cache": func(c *durable.Config) { c.DeniedCacheSize = -1 },
	} {
		cfg := good
		mutate(&cfg)
		if _, err := durable.New(cfg); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := durable.New(good); err != nil {
		t.Fatal(err)
	}
}

// TestDeniedCache checks that a denied key is answered from memory (the
// pool is closed, so any round trip would fail), until its RetryAfter, and
// that this process's Refund and Reset invalidate it.
func TestDeniedCache(t *testing.T) {
	url := pgstoretest.PostgresURL(t)
	pool := pgstoretest.Pool(t, url, 2, "")
	s, err := pgstore.New(pool, pgstore.Config{Schema: pgstoretest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	l, err := durable.New(durable.Config{Store: s, DeniedCacheSize: 2, Now: clock,
		Policy: ratekit.Policy{Name: "cache", Quota: 2, Window: farWindow, Algorithm: ratekit.FixedWindow}, Prefix: pgstoretest.Prefix(t), Durability: durable.Unlogged})
	if err != nil {
		t.Fatal(err)
	}
	req := ratekit.Request{Key: "blocked", Cost: 2}
	if d, err := l.Allow(ctx, req); err != nil || !d.Allowed {
		t.Fatalf("first: %+v, %v", d, err)
	}
	denied, err := l.Allow(ctx, ratekit.Request{Key: "blocked", Cost: 1})
	if err != nil || denied.Allowed {
		t.Fatalf("second: %+v, %v", denied, err)
	}
	pool.Close()
	for _, cost := range []int64{1, 2} {
		d, err := l.Allow(ctx, ratekit.Request{Key: "blocked", Cost: cost})
		if err != nil || d.Allowed || d.RetryAfter != denied.RetryAfter || d.Policy != denied.Policy || d.Quota != 2 {
			t.Fatalf("cached denial for cost %d: %+v, %v", cost, d, err)
		}
		if d, err := l.Peek(ctx, ratekit.Request{Key: "blocked", Cost: cost}); err != nil || d.Allowed {
			t.Fatalf("cached peek: %+v, %v", d, err)
		}
	}
	// The cached answer counts down with the clock and ends at RetryAfter.
	now.Add(int64(denied.RetryAfter / 2))
	if d, err := l.Allow(ctx, ratekit.Request{Key: "blocked", Cost: 1}); err != nil || d.RetryAfter != denied.RetryAfter-denied.RetryAfter/2 {
		t.Fatalf("half-way: %+v, %v", d, err)
	}
	now.Add(int64(denied.RetryAfter))
	if _, err := l.Allow(ctx, ratekit.Request{Key: "blocked", Cost: 1}); err == nil {
		t.Fatal("expired cache entry answered without the database")
	}
	// Requests with an idempotency key always go to the database.
	now.Add(-int64(denied.RetryAfter))
	if _, err := l.Allow(ctx, ratekit.Request{Key: "blocked", Cost: 1, IdempotencyKey: "i"}); err == nil {
		t.Fatal("idempotent request answered from the cache")
	}
}

func TestDeniedCacheInvalidation(t *testing.T) {
	s := newStore(t, pgstoretest.PostgresURL(t), 2)
	ctx := ctxT(t)
	l, err := durable.New(durable.Config{Store: s, DeniedCacheSize: 10,
		Policy: ratekit.Policy{Name: "inv", Quota: 1, Window: time.Hour, Algorithm: ratekit.SlidingLog}, Prefix: pgstoretest.Prefix(t), Durability: durable.Unlogged})
	if err != nil {
		t.Fatal(err)
	}
	req := ratekit.Request{Key: "k", Cost: 1}
	l.Allow(ctx, req)
	if d, _ := l.Allow(ctx, req); d.Allowed {
		t.Fatal("not denied")
	}
	if _, err := l.Refund(ctx, req); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Allow(ctx, req); err != nil || !d.Allowed {
		t.Fatalf("after own refund: %+v, %v", d, err)
	}
	if d, _ := l.Allow(ctx, req); d.Allowed {
		t.Fatal("not denied")
	}
	if err := l.Reset(ctx, req.Key); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Allow(ctx, req); err != nil || !d.Allowed {
		t.Fatalf("after own reset: %+v, %v", d, err)
	}
}

// TestDeniedCacheExactness: the cache never admits, so four instances with
// caches still admit exactly the limit.
func TestDeniedCacheExactness(t *testing.T) {
	for _, via := range []string{"postgres", "pgbouncer"} {
		t.Run(via, func(t *testing.T) {
			url := pgstoretest.PostgresURL(t)
			if via == "pgbouncer" {
				url = pgstoretest.PgBouncerURL(t)
			}
			ctx := ctxT(t)
			prefix := pgstoretest.Prefix(t)
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for i := 0; i < 4; i++ {
				l, err := durable.New(durable.Config{Store: newStore(t, url, 4), DeniedCacheSize: 100,
					Policy: ratekit.Policy{Name: "x", Quota: 100, Window: farWindow, Algorithm: ratekit.FixedWindow}, Prefix: prefix, Durability: durable.Unlogged})
				if err != nil {
					t.Fatal(err)
				}
				for g := 0; g < 64; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for j := 0; j < 3; j++ {
							d, err := l.Allow(ctx, ratekit.Request{Key: "shared", Cost: 1})
							if err != nil {
								t.Error(err)
								return
							}
							if d.Allowed {
								admitted.Add(1)
							}
						}
					}()
				}
			}
			wg.Wait()
			if admitted.Load() != 100 {
				t.Fatalf("admitted %d, want 100", admitted.Load())
			}
		})
	}
}

// BenchmarkAllowDeniedCached measures Allow for keys that are blocked, with
// the denied-key cache (answered in process) and without it (one round trip
// each).
func BenchmarkAllowDeniedCached(b *testing.B) {
	url := pgstoretest.PostgresURL(b)
	ctx := context.Background()
	for _, size := range []int{0, 1024} {
		b.Run(fmt.Sprintf("cache=%d", size), func(b *testing.B) {
			l, err := durable.New(durable.Config{Store: newStore(b, url, 4), DeniedCacheSize: size,
				Policy: ratekit.Policy{Name: "bench", Quota: 1, Window: time.Hour, Algorithm: ratekit.FixedWindow}, Prefix: pgstoretest.Prefix(b), Durability: durable.Unlogged})
			if err != nil {
				b.Fatal(err)
			}
			keys := make([]string, 64)
			for i := range keys {
				keys[i] = fmt.Sprint("blocked-", i)
				l.Allow(ctx, ratekit.Request{Key: keys[i], Cost: 1})
				if d, err := l.Allow(ctx, ratekit.Request{Key: keys[i], Cost: 1}); err != nil || d.Allowed {
					b.Fatalf("setup: %+v, %v", d, err)
				}
			}
			var n atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(n.Add(1))
				for pb.Next() {
					i++
					d, err := l.Allow(ctx, ratekit.Request{Key: keys[i%len(keys)], Cost: 1})
					if err != nil || d.Allowed {
						b.Errorf("%+v, %v", d, err)
						return
					}
				}
			})
		})
	}
}
