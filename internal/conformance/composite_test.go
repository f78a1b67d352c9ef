package conformance_test

import (
	"bytes"

	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/fakeclock"
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
