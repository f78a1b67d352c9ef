package redisstore_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit/kvstore"
)

// redisNow returns Redis's clock in microseconds.
func redisNow(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	tm, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMicro()
}

// TestLuaMatchesGo drives the Lua script and kvstore.Refill.Apply with the
// same random records, refills and operations. When the script writes, the
// record it wrote says which time it read, and the script's result and
// record must equal Apply's at that time exactly. When it writes nothing,
// the level it reports must lie between Go's levels just before and just
// after the call (the level only grows with time). writes counts the exact
// comparisons, so that the test fails if they stop happening.
func TestLuaMatchesGo(t *testing.T) {
	s, c := newStore(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(11, 12))
	writes := 0
	// 400 cases, and more, up to 4000, until 100 wrote: on a busy machine
	// more records refill to full between the Set and the Update (and
	// then nothing is written), so fewer cases compare exactly.
	cases := 0
	for i := 0; i < 400 || (writes < 100 && i < 4000); i++ {
		cases++
		max := 1 + rng.Int64N(kvstore.MaxValue)
		if rng.IntN(2) == 0 {
			max = 1 + rng.Int64N(10_000)
		}
		r := kvstore.Refill{Max: max, Rate: 1 + rng.Int64N(min(max, 5000))}
		op := kvstore.Op(1 + rng.IntN(3))
		n := 1 + rng.Int64N(max)
		if op == kvstore.OpRefund && rng.IntN(4) == 0 {
			n = 1 + rng.Int64N(1<<62)
		}
		key := "k"
		var rec kvstore.Record
		ok := rng.IntN(5) != 0
		if ok {
			rec = kvstore.Record{Value: rng.Int64N(max+1) - rng.Int64N(3), Time: redisNow(t, c) - rng.Int64N(3000) + 500}
			if err := s.Set(ctx, key, rec, time.Minute); err != nil {
				t.Fatal(err)
			}
		} else if err := s.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
		before := redisNow(t, c)
		res, err := s.Update(ctx, key, r, op, n)
		if err != nil {
			t.Fatal(err)
		}
		stored, written, err := s.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		after := redisNow(t, c)
		wrote := written && (!ok || stored != rec)
		if wrote {
			writes++
			want, next, write, _ := r.Apply(rec, ok, stored.Time, op, n)
			if !write || res != want || stored != next {
				t.Fatalf("case %d: %+v op %d n %d from %+v (present %v): Lua %+v, record %+v; Go %+v, record %+v (write %v)",
					i, r, op, n, rec, ok, res, stored, want, next, write)
			}
			continue
		}
		if op == kvstore.OpRefund { // a refund to full deletes the key
			if !res.OK || res.Value != r.Max || written {
				t.Fatalf("case %d: refund %d to %+v under %+v: Lua %+v, record present %v; want full, deleted", i, n, rec, r, res, written)
			}
			continue
		}
		// A take's record can expire before the Get when it refills within a
		// millisecond; then only the bounds can be checked.
		level := res.Value
		if op == kvstore.OpTake && res.OK {
			level += n
		}
		lo, _ := r.Level(rec, ok, before)
		hi, _ := r.Level(rec, ok, after)
		if level < lo || level > hi || res.OK != (level >= n) {
			t.Fatalf("case %d: %+v op %d n %d from %+v (present %v): Lua %+v without a write; Go's level between %d and %d",
				i, r, op, n, rec, ok, res, lo, hi)
		}
	}
	if writes < 100 {
		t.Fatalf("only %d of %d cases wrote; the exact comparison ran too rarely", writes, cases)
	}
}
