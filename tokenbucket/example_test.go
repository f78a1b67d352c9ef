package tokenbucket_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// A search endpoint allows bursts of 5 requests per client and refills one
// request every 2 seconds, in memory.
func Example() {
	store, err := memstore.New(memstore.Config{MaxKeys: 10_000})
	if err != nil {
		log.Fatal(err)
	}
	limiter, err := tokenbucket.New(tokenbucket.Config{
		Name:       "search",
		Burst:      5,
		RefillRate: tokenbucket.Rate{Tokens: 1, Per: 2 * time.Second},
		Mode:       tokenbucket.Atomic,
		Store:      store,
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for i := 1; i <= 6; i++ {
		d, err := limiter.Allow(ctx, ratekit.Request{Key: "client-203.0.113.7", Cost: 1})
		if err != nil {
			log.Fatal(err) // the store failed: the caller's failure policy decides
		}
		fmt.Printf("request %d: allowed=%v remaining=%d\n", i, d.Allowed, d.Remaining)
	}
	p := limiter.Policy()
	fmt.Printf("policy %q: quota %d per %v (%v)\n", p.Name, p.Quota, p.Window, p.Algorithm)
	// Output:
	// request 1: allowed=true remaining=4
	// request 2: allowed=true remaining=3
	// request 3: allowed=true remaining=2
	// request 4: allowed=true remaining=1
	// request 5: allowed=true remaining=0
	// request 6: allowed=false remaining=0
	// policy "search": quota 5 per 10s (TokenBucket)
}

// Decisions are exact to the microsecond, on an injected clock here.
func ExampleLimiter_Allow() {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	store, _ := memstore.New(memstore.Config{Now: clock})
	limiter, _ := tokenbucket.New(tokenbucket.Config{
		Name:       "paid-api",
		Burst:      10,
		RefillRate: tokenbucket.PerSecond(3),
		Mode:       tokenbucket.Atomic,
		Store:      store,
		Now:        clock,
	})
	ctx := context.Background()
	d, _ := limiter.Allow(ctx, ratekit.Request{Key: "key-1", Cost: 10})
	fmt.Println(d.Allowed, d.Remaining, d.ResetAfter)
	d, _ = limiter.Allow(ctx, ratekit.Request{Key: "key-1", Cost: 2})
	fmt.Println(d.Allowed, d.Remaining, d.RetryAfter)
	now = now.Add(d.RetryAfter)
	d, _ = limiter.Allow(ctx, ratekit.Request{Key: "key-1", Cost: 2})
	fmt.Println(d.Allowed, d.Remaining)
	// Output:
	// true 0 3.333334s
	// false 0 666.667ms
	// true 0
}
