package conformance_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
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

// allOf is ratekit.All over one Atomic token bucket per policy, the
// policy's bucket on stores[i].
func allOf(t testing.TB, policies []limitertest.Config, stores []kvstore.Store, now func() time.Time) ratekit.Limiter {
	t.Helper()
	ls := make([]ratekit.Limiter, len(policies))
	for i, cfg := range policies {
		ls[i] = tokenBucket(t, cfg, tokenbucket.Atomic, stores[i], now)
	}
	l, err := ratekit.All(ls...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestAllMemory runs the composite check on ratekit.All over Atomic token
// buckets in memory, one store per policy; the concurrency check's four
// limiters share the stores.
func TestAllMemory(t *testing.T) {
	clock := fakeclock.New(t0)
	stores := func(t testing.TB, n int) []kvstore.Store {
		out := make([]kvstore.Store, n)
		for i := range out {
			s, err := memstore.New(memstore.Config{Now: clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			out[i] = s
		}
		return out
	}
	limitertest.RunComposite(t, limitertest.CompositeHarness{
		New: func(t testing.TB, policies []limitertest.Config) ratekit.Limiter {
			return allOf(t, policies, stores(t, len(policies)), clock.Now)
		},
		NewClients: func(t testing.TB, policies []limitertest.Config, n int) []ratekit.Limiter {
			s := stores(t, len(policies))
			out := make([]ratekit.Limiter, n)
			for i := range out {
				out[i] = allOf(t, policies, s, clock.Now)
			}
			return out
		},
		Advance:   clock.Add,
		Algorithm: ratekit.TokenBucket,
	})
}

// TestAllRedis runs the composite check on ratekit.All over Atomic token
// buckets on Redis, one prefix per policy; the concurrency check's four
// limiters each have a client (a connection pool) of their own.
func TestAllRedis(t *testing.T) {
	addr := testenv.RedisAddr(t)
	newClient := func(t testing.TB) redis.UniversalClient {
		c := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: []string{addr}, PoolSize: 80}, 2*time.Second))
		t.Cleanup(func() { c.Close() })
		return c
	}
	client := newClient(t)
	stores := func(t testing.TB, clients []redis.UniversalClient, n int) [][]kvstore.Store {
		out := make([][]kvstore.Store, len(clients))
		prefixes := make([]string, n)
		for i := range prefixes {
			prefixes[i] = "ratekit-test:conformance:" + randHex() + ":"
			p := prefixes[i]
			t.Cleanup(func() { deleteKeys(client, p) })
		}
		for c := range clients {
			for _, p := range prefixes {
				s, err := redisstore.New(clients[c], redisstore.Config{Prefix: p})
				if err != nil {
					t.Fatal(err)
				}
				out[c] = append(out[c], s)
			}
		}
		return out
	}
	limitertest.RunComposite(t, limitertest.CompositeHarness{
		New: func(t testing.TB, policies []limitertest.Config) ratekit.Limiter {
			return allOf(t, policies, stores(t, []redis.UniversalClient{client}, len(policies))[0], nil)
		},
		NewClients: func(t testing.TB, policies []limitertest.Config, n int) []ratekit.Limiter {
			clients := make([]redis.UniversalClient, n)
			for i := range clients {
				clients[i] = newClient(t)
			}
			s := stores(t, clients, len(policies))
			out := make([]ratekit.Limiter, n)
			for i := range out {
				out[i] = allOf(t, policies, s[i], nil)
			}
			return out
		},
		Algorithm: ratekit.TokenBucket,
	})
}

// TestSignedWindowComposite runs the composite check on signedwindow's
// Composite: every client carries its own token, so the concurrency check
// counts each client's admissions on its own.
func TestSignedWindowComposite(t *testing.T) {
	clock := fakeclock.New(t0)
	var secret byte
	limitertest.RunComposite(t, limitertest.CompositeHarness{
		New: func(t testing.TB, policies []limitertest.Config) ratekit.Limiter {
			secret++
			ps := make([]ratekit.Policy, len(policies))
			for i, p := range policies {
				ps[i] = ratekit.Policy{Name: p.Name, Quota: p.Quota, Window: p.Window}
			}
			l, err := signedwindow.NewComposite(signedwindow.CompositeConfig{
				Policies: ps,
				Keys:     []signedwindow.Key{{ID: 1, Secret: bytes.Repeat([]byte{secret}, signedwindow.MinSecretLen)}},
				Now:      clock.Now,
			})
			if err != nil {
				t.Fatal(err)
			}
			return l
		},
		Advance:      clock.Add,
		Algorithm:    ratekit.FixedWindow,
		ClientState:  true,
		SameKeyParts: true,
	})
}

// compositeBuckets returns tokenbucket's Buckets for the suite's policies:
// a bucket of burst Quota refilled Quota per Window, as tokenBucket builds
// for one policy.
func compositeBuckets(policies []limitertest.Config) []tokenbucket.Bucket {
	b := make([]tokenbucket.Bucket, len(policies))
	for i, p := range policies {
		b[i] = tokenbucket.Bucket{Name: p.Name, Burst: p.Quota, RefillRate: tokenbucket.Rate{Tokens: p.Quota, Per: p.Window}}
	}
	return b
}

func bucketComposite(t testing.TB, policies []limitertest.Config, store kvstore.Store, group bool) ratekit.Limiter {
	t.Helper()
	c, err := tokenbucket.NewComposite(tokenbucket.CompositeConfig{Buckets: compositeBuckets(policies), Mode: tokenbucket.Atomic, Store: store, Group: group})
	if err != nil {
		t.Fatal(err)
	}
	if group {
		return keyedByLastPart{c}
	}
	return c
}

// keyedByLastPart is a grouped tokenbucket.Composite used as its
// documentation says: a request's Key names the subject whose buckets
// every policy shares, so "per user and per organisation" makes Key the
// organisation, the last part's key. It rewrites Request.Key to the last
// part's key when Parts are given, so the suite's requests (Key the user)
// count each bucket under one group whatever the user.
type keyedByLastPart struct{ c *tokenbucket.Composite }

func (k keyedByLastPart) rekey(req ratekit.Request) ratekit.Request {
	if n := len(req.Parts); n > 0 && req.Parts[n-1].Key != "" {
		req.Key = req.Parts[n-1].Key
	}
	return req
}

func (k keyedByLastPart) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return k.c.Allow(ctx, k.rekey(req))
}

func (k keyedByLastPart) Peek(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return k.c.Peek(ctx, k.rekey(req))
}

func (k keyedByLastPart) Refund(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return k.c.Refund(ctx, k.rekey(req))
}

func (k keyedByLastPart) Reset(ctx context.Context, key string) error { return k.c.Reset(ctx, key) }

// TestTokenBucketCompositeMemory runs the composite check on
// tokenbucket.NewComposite over one memstore; the concurrency check's four
// composites share the store, as four limiters of one instance would.
func TestTokenBucketCompositeMemory(t *testing.T) {
	clock := fakeclock.New(t0)
	newStore := func(t testing.TB) kvstore.Store {
		s, err := memstore.New(memstore.Config{Now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	limitertest.RunComposite(t, limitertest.CompositeHarness{
		New: func(t testing.TB, policies []limitertest.Config) ratekit.Limiter {
			return bucketComposite(t, policies, newStore(t), false)
		},
		NewClients: func(t testing.TB, policies []limitertest.Config, n int) []ratekit.Limiter {
			s := newStore(t)
			out := make([]ratekit.Limiter, n)
			for i := range out {
				out[i] = bucketComposite(t, policies, s, false)
			}
			return out
		},
		Advance:   clock.Add,
		Algorithm: ratekit.TokenBucket,
	})
}

// redisComposites returns the harness of tokenbucket composites on Redis:
// each New has a prefix of its own on shared, and NewClients gives each of
// its composites a client (a connection pool) of its own from newClient
// over one shared prefix. cleanup deletes a prefix's keys, or is nil on a
// throwaway server.
func redisComposites(shared redis.UniversalClient, newClient func(t testing.TB) redis.UniversalClient, group bool, cleanup func(prefix string)) limitertest.CompositeHarness {
	prefix := func(t testing.TB) string {
		p := "ratekit-test:conformance:" + randHex() + ":"
		if cleanup != nil {
			t.Cleanup(func() { cleanup(p) })
		}
		return p
	}
	store := func(t testing.TB, c redis.UniversalClient, p string) kvstore.Store {
		s, err := redisstore.New(c, redisstore.Config{Prefix: p})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	return limitertest.CompositeHarness{
		New: func(t testing.TB, policies []limitertest.Config) ratekit.Limiter {
			return bucketComposite(t, policies, store(t, shared, prefix(t)), group)
		},
		NewClients: func(t testing.TB, policies []limitertest.Config, n int) []ratekit.Limiter {
			p := prefix(t)
			out := make([]ratekit.Limiter, n)
			for i := range out {
				out[i] = bucketComposite(t, policies, store(t, newClient(t), p), group)
			}
			return out
		},
		Algorithm: ratekit.TokenBucket,
	}
}

// TestTokenBucketCompositeRedis runs the composite check on
// tokenbucket.NewComposite over redisstore on one Redis server (one Lua
// script per decision), with the buckets in the ordinary key space and in
// the group of the request's key.
func TestTokenBucketCompositeRedis(t *testing.T) {
	addr := testenv.RedisAddr(t)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { admin.Close() })
	newClient := func(t testing.TB) redis.UniversalClient {
		c := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: []string{addr}, PoolSize: 80}, 2*time.Second))
		t.Cleanup(func() { c.Close() })
		return c
	}
	shared := newClient(t)
	for _, group := range []bool{false, true} {
		t.Run(fmt.Sprintf("group=%v", group), func(t *testing.T) {
			limitertest.RunComposite(t, redisComposites(shared, newClient, group, func(p string) { deleteKeys(admin, p) }))
		})
	}
}

// TestTokenBucketCompositeRedisCluster runs the composite check on a
// throwaway Redis Cluster of 3 masters: a composite there needs Group (the
// constructor refuses it without), and every decision's buckets then share
// the hash slot of the request's key.
func TestTokenBucketCompositeRedisCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	newClient := func(t testing.TB) redis.UniversalClient {
		c := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: cluster.Addrs(), IsClusterMode: true, PoolSize: 80}, 2*time.Second))
		t.Cleanup(func() { c.Close() })
		return c
	}
	client := newClient(t)
	store, err := redisstore.New(client, redisstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pol := []limitertest.Config{{Name: "a", Quota: 1, Window: time.Hour}, {Name: "b", Quota: 2, Window: time.Hour}}
	if _, err := tokenbucket.NewComposite(tokenbucket.CompositeConfig{Buckets: compositeBuckets(pol), Mode: tokenbucket.Atomic, Store: store}); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Fatalf("a composite on a cluster without Group: %v, want ErrInvalidConfig", err)
	}
	limitertest.RunComposite(t, redisComposites(client, newClient, true, nil))
}

// TestDurableComposite runs the composite check on durable.NewComposite
// (one statement per decision) for every algorithm, on PostgreSQL directly
// and through PgBouncer in transaction mode; the concurrency check's four
// composites each have a store on a pool of their own over the same
// prefixes.
func TestDurableComposite(t *testing.T) {
	for _, srv := range []struct{ name, url string }{
		{"postgres", pgstoretest.PostgresURL(t)},
		{"pgbouncer", pgstoretest.PgBouncerURL(t)},
	} {
		newStore := func(t testing.TB) *pgstore.Store {
			s, err := pgstore.New(pgstoretest.Pool(t, srv.url, 4, ""), pgstore.Config{Schema: pgstoretest.Schema()})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		shared := newStore(t)
		for _, alg := range []ratekit.Algorithm{ratekit.FixedWindow, ratekit.SlidingWindow, ratekit.TokenBucket, ratekit.SlidingLog} {
			t.Run(srv.name+"/"+alg.String(), func(t *testing.T) {
				composite := func(t testing.TB, s *pgstore.Store, prefix string, policies []limitertest.Config) ratekit.Limiter {
					ls := make([]*durable.Limiter, len(policies))
					for i, p := range policies {
						l, err := durable.New(durable.Config{
							Store:  s,
							Policy: ratekit.Policy{Name: p.Name, Quota: p.Quota, Window: p.Window, Algorithm: alg},
							Prefix: fmt.Sprintf("%s-%d", prefix, i), Durability: durable.Unlogged,
						})
						if err != nil {
							t.Fatal(err)
						}
						ls[i] = l
					}
					c, err := durable.NewComposite(ls...)
					if err != nil {
						t.Fatal(err)
					}
					return c
				}
				limitertest.RunComposite(t, limitertest.CompositeHarness{
					New: func(t testing.TB, policies []limitertest.Config) ratekit.Limiter {
						return composite(t, shared, pgstoretest.Prefix(t), policies)
					},
					NewClients: func(t testing.TB, policies []limitertest.Config, n int) []ratekit.Limiter {
						prefix := pgstoretest.Prefix(t)
						out := make([]ratekit.Limiter, n)
						for i := range out {
							out[i] = composite(t, newStore(t), prefix, policies)
						}
						return out
					},
					Algorithm: alg,
				})
			})
		}
	}
}
