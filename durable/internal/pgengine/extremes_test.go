package pgengine_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable/internal/pgengine"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/internal/extremes"
)

// TestCounterExtremes feeds every numeric field of CounterConfig extreme
// values, for every algorithm: Counter returns a counter or an error
// matching ratekit.ErrInvalidConfig, never panics, and a counter it returns
// answers Take, Peek and Refund on the test database without an error.
func TestCounterExtremes(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 2, "")
	s := newStore(t, pool)
	prefix := pgstoretest.Prefix(t)
	fields := map[string]func(*pgengine.CounterConfig, int64){
		"Quota":        func(c *pgengine.CounterConfig, v int64) { c.Quota = v },
		"Window":       func(c *pgengine.CounterConfig, v int64) { c.Window = time.Duration(v) },
		"CleanupBatch": func(c *pgengine.CounterConfig, v int64) { c.CleanupBatch = int(v) },
		"Algorithm":    func(c *pgengine.CounterConfig, v int64) { c.Algorithm = ratekit.Algorithm(v) },
		"Durability":   func(c *pgengine.CounterConfig, v int64) { c.Durability = pgengine.Durability(v) },
		"Quota=Window": func(c *pgengine.CounterConfig, v int64) { c.Quota, c.Window = v, time.Duration(v) },
	}
	values := append([]int64{}, extremes.Ints...)
	for _, d := range extremes.Durations {
		values = append(values, int64(d))
	}
	type named struct {
		name string
		set  func(*pgengine.CounterConfig)
	}
	var cases []named
	for field, set := range fields {
		for _, v := range values {
			cases = append(cases, named{extremes.Name(field, v), func(c *pgengine.CounterConfig) { set(c, v) }})
		}
	}
	for _, p := range extremes.Floats {
		cases = append(cases, named{extremes.Name("CleanupProbability", p), func(c *pgengine.CounterConfig) { c.CleanupProbability = p }})
	}
	for _, alg := range algorithms {
		for _, c := range cases {
			cfg := pgengine.CounterConfig{Prefix: prefix, Algorithm: alg, Quota: 5, Window: time.Minute, CleanupProbability: -1, Durability: pgengine.Unlogged}
			c.set(&cfg)
			var ctr *pgengine.Counter
			if !extremes.Check(t, fmt.Sprintf("%v/%s", alg, c.name), func() (err error) {
				ctr, err = s.Counter(cfg)
				return err
			}) {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			for _, cost := range []int64{1, ctr.Quota()} {
				ops := map[string]func() (pgengine.Outcome, error){
					"Take":   func() (pgengine.Outcome, error) { return ctr.Take(ctx, "k", cost, "") },
					"Peek":   func() (pgengine.Outcome, error) { return ctr.Peek(ctx, "k", cost) },
					"Refund": func() (pgengine.Outcome, error) { return ctr.Refund(ctx, "k", cost, "") },
				}
				for _, op := range []string{"Take", "Peek", "Refund", "Take"} {
					r, err := ops[op]()
					if err != nil {
						t.Fatalf("%v/%s: %s %d: %v", alg, c.name, op, cost, err)
					}
					if r.Remaining < 0 || r.Remaining > ctr.Quota() || r.RetryAfter < 0 || r.ResetAfter < 0 {
						t.Fatalf("%v/%s: %s %d: result out of range: %+v", alg, c.name, op, cost, r)
					}
				}
			}
			if err := ctr.Reset(ctx, "k"); err != nil {
				t.Fatalf("%v/%s: Reset: %v", alg, c.name, err)
			}
			cancel()
		}
	}
}
