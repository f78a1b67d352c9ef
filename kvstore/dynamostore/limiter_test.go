package dynamostore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/fakeclock"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
	"github.com/ratekit/ratekit/limitertest"
	"github.com/ratekit/ratekit/tokenbucket"
)

func newLimiter(t testing.TB, cfg tokenbucket.Config) *tokenbucket.Limiter {
	t.Helper()
	l, err := tokenbucket.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestLimiterConformance runs the limitertest suite on tokenbucket over the
// Store in both modes, on a fake clock shared by the Store and the limiter.
func TestLimiterConformance(t *testing.T) {
	client := newClient(t, nil)
	for _, mode := range []tokenbucket.Mode{tokenbucket.Atomic, tokenbucket.Eventual} {
		t.Run(mode.String(), func(t *testing.T) {
			clock := fakeclock.New(t0)
			h := limitertest.Harness{
				New: func(t testing.TB, cfg limitertest.Config) ratekit.Limiter {
					store := newStore(t, client, dynamostore.Config{Now: clock.Now})
					return newLimiter(t, tokenbucket.Config{
						Name:       cfg.Name,
						Burst:      cfg.Quota,
						RefillRate: tokenbucket.Rate{Tokens: cfg.Quota, Per: cfg.Window},
						Mode:       mode,
						Store:      store,
						Now:        clock.Now,
					})
				},
				Advance:   clock.Add,
				Algorithm: ratekit.TokenBucket,
			}
			if mode == tokenbucket.Eventual {
				h.MaxAdmitted = func(workers int, limit int64) int64 { return int64(workers) * limit }
			}
			limitertest.Run(t, h)
		})
	}
}

// hammer has clients instances (each its own client, Store and Limiter, as
// separate Lambda instances would be) of perClient goroutines make perG
// requests of cost 1 on one key of a bucket of 100 that refills one token
// an hour, and returns the number admitted.
func hammer(t *testing.T, mode tokenbucket.Mode, clients, perClient, perG int) int64 {
	t.Helper()
	p := prefix(t)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients*perClient)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for c := 0; c < clients; c++ {
		store := newStore(t, newClient(t, nil), dynamostore.Config{Prefix: p})
		l := newLimiter(t, tokenbucket.Config{Name: "exact", Burst: 100, RefillRate: tokenbucket.PerHour(1), Mode: mode, Store: store})
		for g := 0; g < perClient; g++ {
			wg.Go(func() {
				for i := 0; i < perG; i++ {
					d, err := l.Allow(ctx, ratekit.Request{Key: "hot", Cost: 1})
					if err != nil {
						errs <- err
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return admitted.Load()
}

// TestAtomicExact: 4 instances × 64 goroutines on one key of limit 100
// admit exactly 100 in Atomic mode.
func TestAtomicExact(t *testing.T) {
	if got := hammer(t, tokenbucket.Atomic, 4, 64, 2); got != 100 {
		t.Fatalf("4 instances × 64 goroutines × 2 requests on a bucket of 100: %d admitted, want exactly 100", got)
	}
}

// TestEventualOvershoot: Eventual mode is exact without races (one
// goroutine), and admits more than the bucket when 4 instances × 64
// goroutines race on one key; the package doc quotes what it measured.
func TestEventualOvershoot(t *testing.T) {
	if got := hammer(t, tokenbucket.Eventual, 1, 1, 150); got != 100 {
		t.Fatalf("Eventual, one goroutine, 150 requests on a bucket of 100: %d admitted, want 100", got)
	}
	got := hammer(t, tokenbucket.Eventual, 4, 64, 2)
	t.Logf("Eventual: %d of 512 requests admitted on a bucket of 100 by 256 racing goroutines", got)
	if got < 100 {
		t.Fatalf("Eventual admitted %d; want at least the bucket, 100", got)
	}
}

// TestClockSkew: two instances whose clocks differ by skew share a bucket
// of 10 refilled 10 a second (Atomic). The one ahead refills skew ×
// RefillRate tokens the other has not: over any span, skew adds at most
// skew × RefillRate admissions, and the instance behind refills nothing
// until its clock reaches the time the bucket was last written at.
func TestClockSkew(t *testing.T) {
	const skew = 500 * time.Millisecond
	ctx := context.Background()
	behind := fakeclock.New(t0)
	ahead := fakeclock.New(t0.Add(skew))
	p := prefix(t)
	client := newClient(t, nil)
	limiter := func(clock *fakeclock.Clock) *tokenbucket.Limiter {
		store := newStore(t, client, dynamostore.Config{Prefix: p, Now: clock.Now})
		return newLimiter(t, tokenbucket.Config{Name: "skew", Burst: 10, RefillRate: tokenbucket.PerSecond(10), Mode: tokenbucket.Atomic, Store: store, Now: clock.Now})
	}
	slow, fast := limiter(behind), limiter(ahead)
	count := func(l *tokenbucket.Limiter) int {
		n := 0
		for {
			d, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				return n
			}
			n++
		}
	}
	steps := []struct {
		l    *tokenbucket.Limiter
		want int
		what string
	}{
		{slow, 10, "the instance behind empties the bucket"},
		{fast, 5, "the instance ahead sees skew × RefillRate = 5 more tokens"},
		{slow, 0, "the instance behind sees none"},
	}
	for _, s := range steps {
		if got := count(s.l); got != s.want {
			t.Fatalf("%s: %d admitted, want %d", s.what, got, s.want)
		}
	}
	// 300ms later the instance behind is still 200ms before the bucket's
	// time: it sees the bucket's line below zero and admits nothing; the
	// instance ahead admits what refilled (3).
	behind.Add(300 * time.Millisecond)
	ahead.Add(300 * time.Millisecond)
	if got := count(slow); got != 0 {
		t.Fatalf("300ms later, the instance behind: %d admitted, want 0", got)
	}
	if got := count(fast); got != 3 {
		t.Fatalf("300ms later, the instance ahead: %d admitted, want 3", got)
	}
	// A second later both see the same bucket again: 10 refilled, 10
	// admitted in all, whoever asks.
	behind.Add(time.Second)
	ahead.Add(time.Second)
	total := count(slow) + count(fast)
	if total != 10 {
		t.Fatalf("a second later: %d admitted in all, want 10", total)
	}
	// In all 28 = 10 (burst) + 13 (1.3s of refill) + 5 (skew × rate).
}
