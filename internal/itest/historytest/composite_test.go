package historytest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
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
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/limitertest"
	"github.com/ratekit/ratekit/tokenbucket"
)

// A composite's history: two policies on one key. The first ("short") is
// the one under test, a small quota over a second, as in the single-policy
// histories. The second ("long") has a quota of longQuota over a window far
// longer than any run, so it never refills and never binds: its count at
// the end is the sum of what the decisions took from it. Each request takes
// shortCost from the first and longCost from the second.
const (
	longQuota           = 1_000_000
	longWindow          = 10000 * time.Hour
	shortCost, longCost = 1, 2
)

// compositeHistory is what a composite run recorded: for each policy the
// admitted decisions as operations of that policy's part cost (for
// limitertest.CheckOps), and per key the cost that admitted and failed
// decisions asked of the long policy.
type compositeHistory struct {
	mu                 sync.Mutex
	short, long        []limitertest.Op
	admitted, failed   map[string]int64
	nAdmitted, nDenied atomic.Int64
}

func (h *compositeHistory) allow(l ratekit.Limiter, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	d, err := l.Allow(ctx, ratekit.Request{Key: key, Cost: 1, Parts: []ratekit.Part{{Key: key, Cost: shortCost}, {Key: key, Cost: longCost}}})
	end := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err != nil:
		h.failed[key] += longCost
	case d.Allowed:
		h.nAdmitted.Add(1)
		h.admitted[key] += longCost
		h.short = append(h.short, limitertest.Op{Key: key, Cost: shortCost, Outcome: limitertest.Admitted, Start: start, End: end})
		h.long = append(h.long, limitertest.Op{Key: key, Cost: longCost, Outcome: limitertest.Admitted, Start: start, End: end})
	default:
		h.nDenied.Add(1)
	}
}

// runComposite has workers goroutines make composite decisions on keys
// through l, as run does for one policy, then heals the faults (heal may
// be nil) and checks: the short policy's admissions against short, the
// long policy's against its quota, and, read through peek (a composite of
// the same policies over a connection without faults), that on every key
// the long policy lost at least what the admitted decisions took and at
// most that plus what the failed ones asked: a denial that took from the
// long policy, or an admission that did not, shows.
func runComposite(t *testing.T, l, peek ratekit.Limiter, short limitertest.Bound, heal func(), more func() bool) {
	t.Helper()
	h := &compositeHistory{admitted: map[string]int64{}, failed: map[string]int64{}}
	start := time.Now()
	end, giveUp := start.Add(runFor), start.Add(giveUpAfter)
	going := func() bool {
		now := time.Now()
		if now.Before(end) {
			return true
		}
		done := h.nAdmitted.Load() >= minEach && h.nDenied.Load() >= minEach && (more == nil || !more())
		return !done && now.Before(giveUp)
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for i := 0; going(); i++ {
				h.allow(l, keys[(w+i)%len(keys)])
			}
		})
	}
	wg.Wait()
	if heal != nil {
		heal()
	}
	var failed int64
	for _, n := range h.failed {
		failed += n / longCost
	}
	t.Logf("ran for %v: %d admitted, %d denied, %d failed", time.Since(start).Round(time.Millisecond), h.nAdmitted.Load(), h.nDenied.Load(), failed)
	if h.nAdmitted.Load() < minEach || h.nDenied.Load() < minEach {
		t.Fatalf("the run did not exercise the limit in %v: %d admitted, %d denied", giveUpAfter, h.nAdmitted.Load(), h.nDenied.Load())
	}
	if err := limitertest.CheckOps(h.short, short); err != nil {
		t.Fatalf("short policy: %v", err)
	}
	if err := limitertest.CheckOps(h.long, limitertest.FixedWindowBound(longQuota, longWindow, skew)); err != nil {
		t.Fatalf("long policy: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, k := range keys {
		d, err := peek.(ratekit.Peeker).Peek(ctx, ratekit.Request{Key: k, Cost: 1})
		if err != nil {
			t.Fatalf("peek %s: %v", k, err)
		}
		if len(d.Parts) != 2 {
			t.Fatalf("peek %s: %+v, want two parts", k, d)
		}
		took := longQuota - d.Parts[1].Remaining
		if took < h.admitted[k] || took > h.admitted[k]+h.failed[k] {
			t.Errorf("key %s: the long policy lost %d units; admitted decisions took %d and failed ones asked %d more: "+
				"some decision took from one policy without the other", k, took, h.admitted[k], h.failed[k])
		}
	}
}

// bucketPair is tokenbucket's composite of the history's two policies: the
// short bucket of burst 5 refilled 5 a second, and the long one.
func bucketPair(t *testing.T, store kvstore.Store) ratekit.Limiter {
	t.Helper()
	c, err := tokenbucket.NewComposite(tokenbucket.CompositeConfig{
		Buckets: []tokenbucket.Bucket{
			{Name: "short", Burst: 5, RefillRate: tokenbucket.PerSecond(5)},
			{Name: "long", Burst: longQuota, RefillRate: tokenbucket.Rate{Tokens: longQuota, Per: longWindow}},
		},
		Mode:  tokenbucket.Atomic,
		Store: store,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTokenBucketCompositeMemory(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l := bucketPair(t, store)
	runComposite(t, l, l, limitertest.TokenBucketBound(5, 5, time.Second, skew), nil, nil)
}

// TestTokenBucketCompositeRedis runs the composite's history on Redis
// through a proxy that adds latency and resets connections; the end state
// is read over a direct connection once the faults stop.
func TestTokenBucketCompositeRedis(t *testing.T) {
	t.Parallel()
	addr := testenv.RedisAddr(t)
	p := faultproxy.Start(t, addr)
	p.Latency(time.Millisecond, time.Millisecond)
	p.ResetEvery(500*time.Millisecond, 20*time.Millisecond)
	client := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: []string{p.Listen}, PoolSize: workers}, deadline))
	direct := redis.NewClient(&redis.Options{Addr: addr})
	b := make([]byte, 6)
	rand.Read(b)
	prefix := "ratekit-test:history:" + hex.EncodeToString(b) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		for _, k := range keys {
			direct.Del(ctx, prefix+"{short:"+k+"}", prefix+"{long:"+k+"}")
		}
		direct.Close()
		client.Close()
	})
	store, err := redisstore.New(client, redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	directStore, err := redisstore.New(direct, redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	runComposite(t, bucketPair(t, store), bucketPair(t, directStore), limitertest.TokenBucketBound(5, 5, time.Second, skew), p.Heal, nil)
}

// TestDurableComposite runs the composite's history on PostgreSQL and
// through PgBouncer, behind a proxy that adds latency and resets
// connections, with the short policy of each algorithm (2 a second) and
// the long one a fixed window.
func TestDurableComposite(t *testing.T) {
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
				p := faultproxy.Start(t, u.Host)
				p.Latency(time.Millisecond, time.Millisecond)
				p.ResetEvery(500*time.Millisecond, 20*time.Millisecond)
				u.Host = p.Listen
				store, err := pgstore.New(pgstoretest.Pool(t, u.String(), 8, ""), pgstore.Config{Schema: pgstoretest.Schema(), MaxInFlight: 2})
				if err != nil {
					t.Fatal(err)
				}
				directStore, err := pgstore.New(pgstoretest.Pool(t, srv.url, 1, ""), pgstore.Config{Schema: pgstoretest.Schema()})
				if err != nil {
					t.Fatal(err)
				}
				// Create the schema before the faults start: a migration
				// under a short deadline and resets may never finish.
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := directStore.Migrate(ctx); err != nil {
					t.Fatal(err)
				}
				const limit, window = 2, time.Second
				prefix := pgstoretest.Prefix(t)
				pair := func(s *pgstore.Store) ratekit.Limiter {
					short, err := durable.New(durable.Config{Store: s, Prefix: prefix + "-short",
						Policy: ratekit.Policy{Name: "short", Quota: limit, Window: window, Algorithm: alg}, Durability: durable.Unlogged})
					if err != nil {
						t.Fatal(err)
					}
					long, err := durable.New(durable.Config{Store: s, Prefix: prefix + "-long",
						Policy: ratekit.Policy{Name: "long", Quota: longQuota, Window: longWindow, Algorithm: ratekit.FixedWindow}, Durability: durable.Unlogged})
					if err != nil {
						t.Fatal(err)
					}
					c, err := durable.NewComposite(short, long)
					if err != nil {
						t.Fatal(err)
					}
					return c
				}
				var bound limitertest.Bound
				switch alg {
				case ratekit.FixedWindow, ratekit.SlidingWindow:
					bound = limitertest.FixedWindowBound(limit, window, skew)
				case ratekit.TokenBucket:
					bound = limitertest.TokenBucketBound(limit, limit, window, skew)
				case ratekit.SlidingLog:
					bound = limitertest.SlidingLogBound(limit, window, skew)
				default:
					t.Fatal(fmt.Sprint("no bound for ", alg))
				}
				runComposite(t, pair(store), pair(directStore), bound, p.Heal, nil)
			})
		}
	}
}
