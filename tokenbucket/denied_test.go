package tokenbucket_test

import (
	"context"
	"math/rand/v2"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// counting counts the calls that reach an atomic store.
type counting struct {
	kvstore.Atomic
	calls atomic.Int64
}

func (c *counting) Get(ctx context.Context, key string) (kvstore.Record, bool, error) {
	c.calls.Add(1)
	return c.Atomic.Get(ctx, key)
}

func (c *counting) Set(ctx context.Context, key string, rec kvstore.Record, ttl time.Duration) error {
	c.calls.Add(1)
	return c.Atomic.Set(ctx, key, rec, ttl)
}

func (c *counting) Update(ctx context.Context, key string, r kvstore.Refill, op kvstore.Op, n int64) (kvstore.OpResult, error) {
	c.calls.Add(1)
	return c.Atomic.Update(ctx, key, r, op, n)
}

// TestDeniedCacheChangesNoDecision drives a limiter with the denied-key
// cache and one without through the same random requests on the same clock:
// every decision, RetryAfter included, must be the same. (With one instance
// and a fake clock that moves in whole microseconds the cache knows the
// store's level exactly; within a microsecond it rounds the refill up, so
// that it never denies what the store would admit.)
func TestDeniedCacheChangesNoDecision(t *testing.T) {
	for _, mode := range []tokenbucket.Mode{tokenbucket.Eventual, tokenbucket.Atomic} {
		c := newClock()
		cfg := tokenbucket.Config{Name: "p", Burst: 7, RefillRate: tokenbucket.Rate{Tokens: 2, Per: 3 * time.Second}, Mode: mode, Now: c.Now}
		cfg.Store = memStore(t, c.Now)
		plain := newLimiter(t, cfg)
		cfg.Store, cfg.DeniedCacheSize = &counting{Atomic: memStore(t, c.Now)}, 3
		cached := newLimiter(t, cfg)
		rng := rand.New(rand.NewPCG(3, 4))
		ctx := context.Background()
		for i := 0; i < 20_000; i++ {
			c.Add(time.Duration(rng.Int64N(400_000)) * time.Microsecond)
			req := ratekit.Request{Key: string(rune('a' + rng.IntN(5))), Cost: 1 + rng.Int64N(7)}
			var a, b ratekit.Decision
			var errA, errB error
			switch r := rng.IntN(20); {
			case r == 0:
				a, errA = plain.Refund(ctx, req)
				b, errB = cached.Refund(ctx, req)
			case r == 1:
				errA, errB = plain.Reset(ctx, req.Key), cached.Reset(ctx, req.Key)
			case r == 2:
				a, errA = plain.Peek(ctx, req)
				b, errB = cached.Peek(ctx, req)
			default:
				a, errA = plain.Allow(ctx, req)
				b, errB = cached.Allow(ctx, req)
			}
			if errA != nil || errB != nil {
				t.Fatal(errA, errB)
			}
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("%v step %d %+v:\n without cache %+v\n with cache    %+v", mode, i, req, a, b)
			}
		}
		calls := cfg.Store.(*counting).calls.Load()
		t.Logf("%v: %d store calls with the cache for 20,000 requests", mode, calls)
		if mode == tokenbucket.Atomic && calls > 18_000 {
			t.Errorf("the cache answered almost nothing: %d store calls for 20,000 requests", calls)
		}
	}
}

func TestDeniedCacheSavesRoundTrips(t *testing.T) {
	c := newClock()
	store := &counting{Atomic: memStore(t, c.Now)}
	l := newLimiter(t, tokenbucket.Config{Name: "p", Burst: 2, RefillRate: tokenbucket.PerSecond(1), Mode: tokenbucket.Atomic, Store: store, Now: c.Now, DeniedCacheSize: 10})
	ctx := context.Background()
	req := ratekit.Request{Key: "client", Cost: 1}
	l.Allow(ctx, req)
	l.Allow(ctx, req)
	d, _ := l.Allow(ctx, req) // empty: denied by the store, cached
	if d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("third request = %+v; want denied, retry after 1s", d)
	}
	calls := store.calls.Load()
	for i := 0; i < 100; i++ {
		c.Add(9 * time.Millisecond)
		d, _ := l.Allow(ctx, req)
		if want := time.Second - time.Duration(i+1)*9*time.Millisecond; d.Allowed || d.RetryAfter != want {
			t.Fatalf("blocked request %d = %+v; want denied, retry after %v", i, d, want)
		}
	}
	if got := store.calls.Load() - calls; got != 0 {
		t.Fatalf("100 requests from a blocked client made %d store calls, want 0", got)
	}
	// A cheaper request than the denied one is still denied from the cache
	// when the bucket cannot hold it either; the other key goes to the store.
	l.Allow(ctx, ratekit.Request{Key: "other", Cost: 1})
	if got := store.calls.Load() - calls; got != 1 {
		t.Fatalf("a request for another key made %d store calls, want 1", got)
	}
	c.Add(100 * time.Millisecond) // 1s after the denial: the retry time
	if d, _ := l.Allow(ctx, req); !d.Allowed {
		t.Fatalf("at the retry time: %+v, want allowed", d)
	}
	// Refund clears the entry at once.
	l.Allow(ctx, req)
	l.Allow(ctx, ratekit.Request{Key: "client", Cost: 2})
	l.Refund(ctx, ratekit.Request{Key: "client", Cost: 2})
	if d, _ := l.Allow(ctx, ratekit.Request{Key: "client", Cost: 2}); !d.Allowed {
		t.Fatalf("after a refund: %+v, want allowed", d)
	}
}
