package conformance_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/internal/fakeclock"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/limitertest"
	"github.com/ratekit/ratekit/signedwindow"
	"github.com/ratekit/ratekit/tokenbucket"
)

func TestMain(m *testing.M) { pgstoretest.Main(m, testenv.CheckLeaks) }

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// upTo is the bound of limiters that document no exactness under
// concurrency: each of the workers may be admitted up to the limit.
func upTo(workers int, limit int64) int64 { return int64(workers) * limit }

func TestSignedWindow(t *testing.T) {
	for _, cache := range []int{0, 1024} {
		t.Run(fmt.Sprintf("replay-cache-%d", cache), func(t *testing.T) {
			clock := fakeclock.New(t0)
			var secret byte
			h := limitertest.Harness{
				New: func(t testing.TB, cfg limitertest.Config) ratekit.Limiter {
					secret++ // a key of its own: tokens of one limiter mean nothing to another
					l, err := signedwindow.New(signedwindow.Config{
						Name:            cfg.Name,
						Quota:           cfg.Quota,
						Window:          cfg.Window,
						Keys:            []signedwindow.Key{{ID: 1, Secret: bytes.Repeat([]byte{secret}, signedwindow.MinSecretLen)}},
						Now:             clock.Now,
						ReplayCacheSize: cache,
					})
					if err != nil {
						t.Fatal(err)
					}
					return l
				},
				Advance:     clock.Add,
				Algorithm:   ratekit.FixedWindow,
				ClientState: true,
			}
			if cache == 0 {
				// Without the cache, clients that start without a token
				// each get a window of their own (best-effort friction).
				h.MaxAdmitted = upTo
			}
			limitertest.Run(t, h)
		})
	}
}

func tokenBucket(t testing.TB, cfg limitertest.Config, mode tokenbucket.Mode, store kvstore.Store, now func() time.Time) ratekit.Limiter {
	t.Helper()
	l, err := tokenbucket.New(tokenbucket.Config{
		Name:       cfg.Name,
		Burst:      cfg.Quota,
		RefillRate: tokenbucket.Rate{Tokens: cfg.Quota, Per: cfg.Window},
		Mode:       mode,
		Store:      store,
		Now:        now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestTokenBucketMemory(t *testing.T) {
	for _, mode := range []tokenbucket.Mode{tokenbucket.Atomic, tokenbucket.Eventual} {
		t.Run(mode.String(), func(t *testing.T) {
			clock := fakeclock.New(t0)
			h := limitertest.Harness{
				New: func(t testing.TB, cfg limitertest.Config) ratekit.Limiter {
					store, err := memstore.New(memstore.Config{Now: clock.Now})
					if err != nil {
						t.Fatal(err)
					}
					return tokenBucket(t, cfg, mode, store, clock.Now)
				},
				Advance:   clock.Add,
				Algorithm: ratekit.TokenBucket,
			}
			if mode == tokenbucket.Eventual {
				h.MaxAdmitted = upTo
			}
			limitertest.Run(t, h)
		})
	}
}

func TestTokenBucketRedis(t *testing.T) {
	addr := testenv.RedisAddr(t)
	client := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: []string{addr}, PoolSize: 80}, 2*time.Second))
	t.Cleanup(func() { client.Close() })
	for _, mode := range []tokenbucket.Mode{tokenbucket.Atomic, tokenbucket.Eventual} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := limitertest.Harness{
				New: func(t testing.TB, cfg limitertest.Config) ratekit.Limiter {
					prefix := "ratekit-test:conformance:" + randHex() + ":"
					t.Cleanup(func() { deleteKeys(client, prefix) })
					store, err := redisstore.New(client, redisstore.Config{Prefix: prefix})
					if err != nil {
						t.Fatal(err)
					}
					return tokenBucket(t, cfg, mode, store, nil)
				},
				Algorithm: ratekit.TokenBucket,
			}
			if mode == tokenbucket.Eventual {
				h.MaxAdmitted = upTo
			}
			limitertest.Run(t, h)
		})
	}
}

// TestTokenBucketRedisCluster runs the suite on a throwaway Redis Cluster
// of 3 masters through a go-redis ClusterClient, coalescing on: every
// script's key carries a hash tag, so no command fails with CROSSSLOT, and
// the suite's keys land on all the masters (tokenbucket's
// TestRedisClusterAtomicExact checks the spread).
func TestTokenBucketRedisCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	client := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: cluster.Addrs(), IsClusterMode: true, PoolSize: 80}, 2*time.Second))
	t.Cleanup(func() { client.Close() })
	if _, ok := client.(*redis.ClusterClient); !ok {
		t.Fatalf("client is a %T, want a *redis.ClusterClient", client)
	}
	for _, mode := range []tokenbucket.Mode{tokenbucket.Atomic, tokenbucket.Eventual} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := limitertest.Harness{
				New: func(t testing.TB, cfg limitertest.Config) ratekit.Limiter {
					// A throwaway cluster: its keys go with it.
					store, err := redisstore.New(client, redisstore.Config{Prefix: "ratekit-test:conformance:" + randHex() + ":"})
					if err != nil {
						t.Fatal(err)
					}
					return tokenBucket(t, cfg, mode, store, nil)
				},
				Algorithm: ratekit.TokenBucket,
			}
			if mode == tokenbucket.Eventual {
				h.MaxAdmitted = upTo
			}
			limitertest.Run(t, h)
		})
	}
}

func TestDurable(t *testing.T) {
	servers := []struct{ name, url string }{
		{"postgres", pgstoretest.PostgresURL(t)},
		{"pgbouncer", pgstoretest.PgBouncerURL(t)},
	}
	for _, srv := range servers {
		// Coalescing on (the default MaxInFlight): the suite's 64 workers
		// queue beyond it, and some decisions must have gone in batches.
		tr := &pgstoretest.BatchCounter{}
		store, err := pgstore.New(pgstoretest.TracedPool(t, srv.url, 16, tr), pgstore.Config{Schema: pgstoretest.Schema()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if tr.Batches.Load() == 0 {
				t.Errorf("%s: no batch formed: the suite did not cover coalescing", srv.name)
			}
		})
		for _, alg := range []ratekit.Algorithm{ratekit.FixedWindow, ratekit.SlidingWindow, ratekit.TokenBucket, ratekit.SlidingLog} {
			durabilities := []durable.Durability{durable.Unlogged}
			if srv.name == "postgres" && alg == ratekit.TokenBucket {
				durabilities = append(durabilities, durable.Logged)
			}
			for _, dur := range durabilities {
				t.Run(fmt.Sprintf("%s/%v/%v", srv.name, alg, dur), func(t *testing.T) {
					t.Parallel()
					limitertest.Run(t, limitertest.Harness{
						New: func(t testing.TB, cfg limitertest.Config) ratekit.Limiter {
							l, err := durable.New(durable.Config{
								Store:      store,
								Policy:     ratekit.Policy{Name: cfg.Name, Quota: cfg.Quota, Window: cfg.Window, Algorithm: alg},
								Prefix:     pgstoretest.Prefix(t),
								Durability: dur,
							})
							if err != nil {
								t.Fatal(err)
							}
							return l
						},
						Algorithm: alg,
					})
				})
			}
		}
	}
}

func randHex() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func deleteKeys(c redis.UniversalClient, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		c.Del(ctx, iter.Val())
	}
}

// TestOnePolicyOneHeader builds the bucket of burst 20 refilled at 5 units a
// second in every strategy that has a token bucket, in each one's own
// configuration terms, and the windows of quota 20 per 4s, and checks that
// all of them advertise the same RateLimit-Policy field byte for byte, and
// r=19 after the first request: r never exceeds q.
func TestOnePolicyOneHeader(t *testing.T) {
	const want = `"same";q=20;w=4`
	key := func(t *testing.T) string { return "one-policy:" + randHex() }
	limiters := map[string]func(t *testing.T) ratekit.Limiter{
		"tokenbucket/memory": func(t *testing.T) ratekit.Limiter {
			store, err := memstore.New(memstore.Config{})
			if err != nil {
				t.Fatal(err)
			}
			return newBucket(t, store)
		},
		"tokenbucket/redis": func(t *testing.T) ratekit.Limiter {
			client := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
			t.Cleanup(func() { client.Close() })
			prefix := "ratekit-test:one-policy:" + randHex() + ":"
			t.Cleanup(func() { deleteKeys(client, prefix) })
			store, err := redisstore.New(client, redisstore.Config{Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			return newBucket(t, store)
		},
		"signedwindow": func(t *testing.T) ratekit.Limiter {
			l, err := signedwindow.New(signedwindow.Config{Name: "same", Quota: 20, Window: 4 * time.Second,
				Keys: []signedwindow.Key{{ID: 1, Secret: bytes.Repeat([]byte{7}, signedwindow.MinSecretLen)}}})
			if err != nil {
				t.Fatal(err)
			}
			return l
		},
	}
	store, err := pgstore.New(pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 2, ""), pgstore.Config{Schema: pgstoretest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	for _, alg := range []ratekit.Algorithm{ratekit.TokenBucket, ratekit.FixedWindow, ratekit.SlidingWindow, ratekit.SlidingLog} {
		limiters["durable/"+alg.String()] = func(t *testing.T) ratekit.Limiter {
			l, err := durable.New(durable.Config{Store: store, Prefix: pgstoretest.Prefix(t),
				Policy: ratekit.Policy{Name: "same", Quota: 20, Window: 4 * time.Second, Algorithm: alg}, Durability: durable.Unlogged})
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
	}
	for name, newLimiter := range limiters {
		t.Run(name, func(t *testing.T) {
			l := newLimiter(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			d, err := l.Allow(ctx, ratekit.Request{Key: key(t), Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			h := http.Header{}
			httplimit.SetHeaders(h, d, false)
			if got := h.Get(httplimit.HeaderRateLimitPolicy); got != want {
				t.Errorf("RateLimit-Policy %q, want %q", got, want)
			}
			if got := h.Get(httplimit.HeaderRateLimit); !strings.HasPrefix(got, `"same";r=19;t=`) {
				t.Errorf("RateLimit %q, want r=19", got)
			}
		})
	}
}

// newBucket is tokenbucket's bucket of burst 20 refilled at 5 a second.
func newBucket(t *testing.T, store kvstore.Store) ratekit.Limiter {
	l, err := tokenbucket.New(tokenbucket.Config{Name: "same", Burst: 20, RefillRate: tokenbucket.PerSecond(5), Mode: tokenbucket.Atomic, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	return l
}
