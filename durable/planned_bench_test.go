package durable_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
)

// BenchmarkPlannedAllow compares a decision of a burst and a monthly quota
// with a plan lookup (Planned, the plan served from memory) against the
// same two policies in a fixed Composite, over 1,000 keys.
func BenchmarkPlannedAllow(b *testing.B) {
	s := newStore(b, pgstoretest.PostgresURL(b), 2)
	ctx := context.Background()
	prefix := pgstoretest.Prefix(b)
	burst := ratekit.Policy{Name: "burst", Quota: 1_000_000, Window: time.Hour, Algorithm: ratekit.TokenBucket}
	monthly := ratekit.Policy{Name: "monthly", Quota: 1_000_000_000, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Month}}
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	run := func(b *testing.B, l ratekit.Limiter) {
		for i := 0; b.Loop(); i++ {
			if d, err := l.Allow(ctx, ratekit.Request{Key: keys[i%len(keys)], Cost: 1}); err != nil || !d.Allowed {
				b.Fatalf("%+v, %v", d, err)
			}
		}
	}
	b.Run("composite", func(b *testing.B) {
		lb, err := durable.New(durable.Config{Store: s, Policy: burst, Prefix: prefix + "-cb", Durability: durable.Logged, CleanupProbability: -1})
		if err != nil {
			b.Fatal(err)
		}
		lm, err := durable.New(durable.Config{Store: s, Policy: monthly, Prefix: prefix + "-cm", Durability: durable.Logged, CleanupProbability: -1})
		if err != nil {
			b.Fatal(err)
		}
		run(b, newComposite(b, lb, lm))
	})
	b.Run("planned", func(b *testing.B) {
		plans := map[string]ratekit.Plan{}
		for i, k := range keys {
			m := monthly
			m.Period.Anchor = time.Date(2026, time.January, 1+i%28, 9, 0, 0, 0, time.UTC)
			plans[k] = ratekit.Plan{Name: "pro", Policies: []ratekit.Policy{burst, m}}
		}
		p, err := durable.NewPlanned(durable.PlannedConfig{Store: s, Prefix: prefix + "-p", Durability: durable.Logged, CleanupProbability: -1,
			Plan: func(_ context.Context, key string) (ratekit.Plan, error) { return plans[key], nil }})
		if err != nil {
			b.Fatal(err)
		}
		run(b, p)
	})
}
