package historytest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/internal/itest/faultproxy"
	"github.com/ratekit/ratekit/internal/itest/redisclient"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/limitertest"
	"github.com/ratekit/ratekit/tokenbucket"
)

func TestMain(m *testing.M) { pgstoretest.Main(m, testenv.CheckLeaks) }

const (
	workers = 32
	// A run lasts runFor, and longer, up to giveUpAfter, until it has
	// exercised the limit (and whatever else the test needs): a busy
	// machine may make few decisions in runFor.
	runFor      = 2 * time.Second
	giveUpAfter = 60 * time.Second
	// deadline is each decision's. It is not under test (a failed
	// decision is recorded as such and admits nothing), and it bounds
	// dials too: with a short one, a busy machine fails every dial, and
	// go-redis stops dialling after PoolSize failed dials in a row.
	deadline = 5 * time.Second
	// skew covers the difference between the store's clock and this
	// process's on one host (both read the same system clock).
	skew = 2 * time.Millisecond
)

var keys = []string{"alpha", "beta", "gamma"}

// faultyProxy starts an in-process toxiproxy in front of upstream with
// 1 ms ± 1 ms of latency each way, and resets every connection that sends
// data through it (TCP RST) for 20 ms every 500 ms, until stop is called.
func faultyProxy(t *testing.T, upstream string) (listen string, stop func()) {
	t.Helper()
	p := faultproxy.Start(t, upstream)
	p.Latency(time.Millisecond, time.Millisecond)
	p.ResetEvery(500*time.Millisecond, 20*time.Millisecond)
	return p.Listen, p.Stop
}

// minEach is how many admissions and how many denials a run needs to have
// exercised the limit.
const minEach = 10

// run has workers goroutines make decisions of cost 1 on keys, each with
// its own deadline, recording them, for runFor and then until the run
// exercised the limit and more() is false (more may be nil), for at most
// giveUpAfter; then checks the history against bound and that the run
// exercised the limit.
func run(t *testing.T, l ratekit.Limiter, bound limitertest.Bound, stop func(), more func() bool) {
	t.Helper()
	var h limitertest.History
	var admitted, denied atomic.Int64
	start := time.Now()
	end, giveUp := start.Add(runFor), start.Add(giveUpAfter)
	going := func() bool {
		now := time.Now()
		if now.Before(end) {
			return true
		}
		done := admitted.Load() >= minEach && denied.Load() >= minEach && (more == nil || !more())
		return !done && now.Before(giveUp)
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for i := 0; going(); i++ {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				d, err := h.Allow(ctx, l, ratekit.Request{Key: keys[(w+i)%len(keys)], Cost: 1})
				cancel()
				switch {
				case err != nil:
				case d.Allowed:
					admitted.Add(1)
				default:
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("ran for %v", time.Since(start).Round(time.Millisecond))
	if stop != nil {
		stop()
	}
	nAdmitted, nDenied, nFailed := h.Count(limitertest.Admitted), h.Count(limitertest.Denied), h.Count(limitertest.Failed)
	t.Logf("%d admitted, %d denied, %d failed", nAdmitted, nDenied, nFailed)
	if nAdmitted < minEach || nDenied < minEach {
		t.Fatalf("the run did not exercise the limit in %v: %d admitted, %d denied", giveUpAfter, nAdmitted, nDenied)
	}
	if err := h.Check(bound); err != nil {
		t.Fatal(err)
	}
}

func tokenBucket(t *testing.T, store kvstore.Store, mode tokenbucket.Mode) ratekit.Limiter {
	t.Helper()
	// Burst 5, refilled 5 a second: a busy machine's workers may make
	// only a few decisions a second on each key, and must still be
	// denied.
	l, err := tokenbucket.New(tokenbucket.Config{Name: "history", Burst: 5, RefillRate: tokenbucket.PerSecond(5), Mode: mode, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestTokenBucketMemory(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	run(t, tokenBucket(t, store, tokenbucket.Atomic), limitertest.TokenBucketBound(5, 5, time.Second, skew), nil, nil)
}

func TestTokenBucketRedis(t *testing.T) {
	addr := testenv.RedisAddr(t)
	for _, mode := range []tokenbucket.Mode{tokenbucket.Atomic, tokenbucket.Eventual} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			listen, stop := faultyProxy(t, addr)
			client := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: []string{listen}, PoolSize: workers}, deadline))
			// 32 workers and the store's default of 8 round trips in
			// flight: decisions queue and go in pipelines (coalescing).
			counter := &redisclient.CommandCounter{}
			client.AddHook(counter)
			b := make([]byte, 6)
			rand.Read(b)
			prefix := "ratekit-test:history:" + hex.EncodeToString(b) + ":"
			t.Cleanup(func() {
				ctx := context.Background()
				direct := redis.NewClient(&redis.Options{Addr: addr})
				for _, k := range keys {
					direct.Del(ctx, prefix+"{"+"history:"+k+"}")
				}
				direct.Close()
				client.Close()
			})
			store, err := redisstore.New(client, redisstore.Config{Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			bound := limitertest.TokenBucketBound(5, 5, time.Second, skew)
			if mode == tokenbucket.Eventual {
				// The package documents no bound that holds regardless of
				// timing; with every worker racing in lock step it
				// documents about workers × the bucket.
				one := bound
				bound = func(a, b time.Time) int64 { return workers * one(a, b) }
			}
			run(t, tokenBucket(t, store, mode), bound, stop, func() bool { return counter.Pipelined.Load() == 0 })
			if counter.Pipelined.Load() == 0 {
				t.Fatal("no command went in a pipeline: the history did not cover coalescing")
			}
			t.Logf("%d commands, %d of them in pipelines", counter.N.Load(), counter.Pipelined.Load())
		})
	}
}

func TestDurable(t *testing.T) {
	for _, srv := range []struct{ name, url string }{
		{"postgres", pgstoretest.PostgresURL(t)},
		{"pgbouncer", pgstoretest.PgBouncerURL(t)},
	} {
		for _, alg := range []ratekit.Algorithm{ratekit.FixedWindow, ratekit.SlidingWindow, ratekit.TokenBucket, ratekit.SlidingLog} {
			t.Run(srv.name+"/"+alg.String(), func(t *testing.T) {
				t.Parallel()
				u, err := url.Parse(srv.url)
				if err != nil {
					t.Fatal(err)
				}
				listen, stop := faultyProxy(t, u.Host)
				u.Host = listen
				// 32 workers and 2 decisions in flight: decisions queue
				// and go in batches (coalescing).
				tr := &pgstoretest.BatchCounter{}
				pool := pgstoretest.TracedPool(t, u.String(), 16, tr)
				store, err := pgstore.New(pool, pgstore.Config{Schema: pgstoretest.Schema(), MaxInFlight: 2})
				if err != nil {
					t.Fatal(err)
				}
				// Create the schema before the faults start: a migration
				// under a short deadline and resets may never finish.
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				for err := store.Migrate(ctx); err != nil; err = store.Migrate(ctx) {
					if ctx.Err() != nil {
						t.Fatal(err)
					}
				}
				// 2 a second on each key: under load the 32 workers made
				// about 4 decisions a second on each key, fewer than 5 per
				// 500ms refilled, and were rarely denied.
				const limit, window = 2, time.Second
				policy := ratekit.Policy{Name: "history", Quota: limit, Window: window, Algorithm: alg}
				l, err := durable.New(durable.Config{Store: store, Policy: policy, Prefix: pgstoretest.Prefix(t), Durability: durable.Unlogged})
				if err != nil {
					t.Fatal(err)
				}
				var bound limitertest.Bound
				switch alg {
				case ratekit.FixedWindow, ratekit.SlidingWindow:
					bound = limitertest.FixedWindowBound(limit, window, skew)
				case ratekit.TokenBucket:
					bound = limitertest.TokenBucketBound(limit, limit, window, skew)
				case ratekit.SlidingLog:
					bound = limitertest.SlidingLogBound(limit, window, skew)
				}
				// Keep going until a batch formed, up to the run's limit.
				run(t, l, bound, stop, func() bool { return tr.Batches.Load() == 0 })
				if tr.Batches.Load() == 0 {
					t.Fatal("no batch formed: the history did not cover coalescing")
				}
				t.Logf("%d statements, %d of them batches", tr.Statements.Load(), tr.Batches.Load())
			})
		}
	}
}
