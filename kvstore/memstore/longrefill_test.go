package memstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// A bucket whose time to fill is the longest a Refill allows (2^52 µs, about
// 142 years) must not expire at once and read as full: burst 1 refilled once
// per century admits once, then denies.
func TestLongRefillDoesNotExpire(t *testing.T) {
	year := 365 * 24 * time.Hour
	for _, per := range []time.Duration{100 * year, 142 * year} {
		store, err := memstore.New(memstore.Config{MaxKeys: 10})
		if err != nil {
			t.Fatal(err)
		}
		l, err := tokenbucket.New(tokenbucket.Config{Name: "slow", Burst: 1, RefillRate: tokenbucket.Rate{Tokens: 1, Per: per}, Mode: tokenbucket.Atomic, Store: store})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for i, want := range []bool{true, false, false} {
			d, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed != want {
				t.Fatalf("refill once per %v, request %d: allowed %v, want %v", per, i+1, d.Allowed, want)
			}
			if !want && d.RetryAfter <= 0 {
				t.Fatalf("refill once per %v: a denial with RetryAfter %v", per, d.RetryAfter)
			}
		}
	}
}
