package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/kvstore"
)

// redisMillis returns Redis's clock in whole milliseconds, the clock of the
// update script.
func redisMillis(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	tm, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMilli()
}

// bucketState is what the update script keeps under a key: its expiry E (in
// milliseconds) and value w; present is false for an absent key.
type bucketState struct {
	present bool
	e, w    int64
}

func readState(t *testing.T, c *redis.Client, key string) bucketState {
	t.Helper()
	// One script, so that the key cannot expire between the two reads.
	v, err := c.Eval(context.Background(), "return {redis.call('PEXPIRETIME', KEYS[1]), redis.call('GET', KEYS[1])}", []string{key}).Slice()
	if err != nil {
		t.Fatal(err)
	}
	e := v[0].(int64)
	if e == -2 {
		return bucketState{}
	}
	s, _ := v[1].(string)
	w, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("value %q: %v", s, err)
	}
	return bucketState{true, e, w}
}

// takeLetters are the update script's two takes: decrement first and read
// first.
var takeLetters = [2]string{"T", "t"}

// takeWith runs the update script's take of n on the Redis key rkey with
// the op argument letter.
func takeWith(ctx context.Context, c *redis.Client, rkey string, r kvstore.Refill, n int64, letter string) (kvstore.OpResult, error) {
	v, err := c.Eval(ctx, updateLua, []string{rkey}, r.Burst, redistest.RateArg(r), n, letter).Int64()
	if err != nil {
		return kvstore.OpResult{}, err
	}
	if v < 0 {
		return kvstore.OpResult{Remaining: -v - 1}, nil
	}
	return kvstore.OpResult{OK: true, Remaining: v}, nil
}

// recordMatches reports whether got, the state of a bucket's key read at
// Redis millisecond read after an update that found old and ran at
// millisecond ms, is what kvstore.Refill.Apply says of r: next when it
// writes (write), the state as it was otherwise.
func recordMatches(r kvstore.Refill, old, got bucketState, write bool, next kvstore.Record, ms, read int64) bool {
	rate := redistest.RateArg(r)
	switch {
	case !write:
		// Nothing written: the key is as it was, or gone because the
		// bucket filled up meanwhile.
		return got == old || !got.present
	case next.Value >= r.Burst:
		return !got.present
	case got.present:
		// The debt the record encodes is Apply's, and the key expires no
		// earlier than the bucket is full (w >= 0) and no later than an
		// empty bucket's fill time.
		debt := r.Burst - next.Value
		return got.w >= 0 && (got.e-ms)*rate-got.w == debt && got.e-ms <= (r.Burst+rate-1)/rate
	default:
		// Gone: only when the bucket was full again before the state was
		// read.
		debt := r.Burst - next.Value
		return ms+(debt+rate-1)/rate <= read
	}
}

// randomRefill returns a refill for the random sequences of the tests
// below: a maximum of up to 2^52 or up to 10,000, a refill that makes a
// bucket full again within a microsecond, or a slow refill of a small
// bucket, whose key lives up to max/1000 ms, so that pauses of milliseconds
// find buckets that refilled while their key lives on.
func randomRefill(rng *rand.Rand) kvstore.Refill {
	max := 1 + rng.Int64N(kvstore.MaxValue)
	if rng.IntN(2) == 0 {
		max = 1 + rng.Int64N(10_000)
	}
	r := kvstore.Refill{Burst: max, Rate: 1 + rng.Int64N(min(max, 5000))}
	switch rng.IntN(4) {
	case 0:
		r.Rate = max
	case 1:
		r = kvstore.Refill{Burst: 2000 + rng.Int64N(8000), Rate: 1}
	}
	return r
}

// randomN returns a random n for an op on r: any in [1, max], often a
// small one, and for a refund sometimes far beyond max.
func randomN(rng *rand.Rand, r kvstore.Refill, op kvstore.Op) int64 {
	n := 1 + rng.Int64N(r.Burst)
	if rng.IntN(2) == 0 {
		n = 1 + rng.Int64N(1+r.Burst/8)
	}
	if op == kvstore.OpRefund && rng.IntN(4) == 0 {
		n = 1 + rng.Int64N(1<<62)
	}
	return n
}

// TestLuaMatchesGo drives the update script and kvstore.Refill.Apply through
// the same random sequences of operations on random refills. The script
// reads Redis's clock in whole milliseconds: for each call, some millisecond
// between Redis's TIME just before and just after it must give, through
// Apply on the reference record, the script's result exactly, and the record
// the script left (the debt its expiry and value encode at that millisecond)
// must be Apply's; the reference record then moves to Apply's. So the Lua
// arithmetic is checked to the unit at every step, across fresh keys,
// refills (pauses of up to 3 ms), clamping refunds, keys that expired and
// keys that outlived their bucket's refill, and for both orders of a take.
func TestLuaMatchesGo(t *testing.T) {
	s, c := newStore(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(11, 12))
	const key = "k"
	steps, writes := 0, 0
	for seq := 0; seq < 60; seq++ {
		r := randomRefill(rng)
		rate := redistest.RateArg(r)
		if err := s.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
		var ref kvstore.Record
		refOK := false
		for range 40 {
			steps++
			op := kvstore.Op(1 + rng.IntN(3))
			n := randomN(rng, r, op)
			if rng.IntN(6) == 0 {
				// Let the bucket refill, often to full while its key
				// lives on (the key outlives a refill that ends early).
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
			}
			old := readState(t, c, s.Key(key))
			before := redisMillis(t, c)
			var (
				res kvstore.OpResult
				err error
			)
			if op == kvstore.OpTake && rng.IntN(2) == 0 {
				// Both orders of a take, whatever the store would pick.
				res, err = takeWith(ctx, c, s.Key(key), r, n, takeLetters[rng.IntN(2)])
			} else {
				res, err = s.Update(ctx, key, r, op, n)
			}
			if err != nil {
				t.Fatal(err)
			}
			after := redisMillis(t, c)
			got := readState(t, c, s.Key(key))
			read := redisMillis(t, c)
			matched := false
			for ms := before; ms <= after && !matched; ms++ {
				want, next, write, err := r.Apply(ref, refOK, ms*1000, op, n)
				if err != nil {
					t.Fatal(err)
				}
				if want != res {
					continue
				}
				matched = recordMatches(r, old, got, write, next, ms, read)
				if matched && write {
					ref, refOK = next, next.Value < r.Burst
					writes++
				}
			}
			if !matched {
				t.Fatalf("sequence %d, %+v (rate %d/ms): op %d n %d on reference %+v (present %v), state %+v: Lua %+v, state after %+v; Apply agrees at no millisecond from %d to %d",
					seq, r, rate, op, n, ref, refOK, old, res, got, before, after)
			}
		}
	}
	if writes < steps/4 {
		t.Fatalf("only %d of %d steps wrote; the record comparison ran too rarely", writes, steps)
	}
}

// multiWith runs the multi-key script with the op argument letter on the
// Redis keys rkeys, key i under rs[i] with ns[i]; with counter set (a
// Redis key), it runs the period script instead, on the same buckets and
// a period counter of a quota no take reaches, and returns the buckets'
// results.
func multiWith(ctx context.Context, c *redis.Client, rkeys []string, rs []kvstore.Refill, ns []int64, letter, counter string) ([]kvstore.OpResult, error) {
	args := []any{letter}
	for i := range rkeys {
		if counter != "" {
			args = append(args, "b")
		}
		args = append(args, rs[i].Burst, redistest.RateArg(rs[i]), ns[i])
	}
	script, keys := multiLua, rkeys
	if counter != "" {
		now := time.Now().UnixMicro()
		b := [4]int64{now - 3600e6, now - 60e6, now + 3600e6, now + 7200e6}
		span := (b[2]+999)/1000 + 60_000 - (b[0]+999)/1000
		args = append(args, "p", b[0], fmt.Sprintf("%d %d", b[1], b[2]), b[3], span, kvstore.MaxValue, 1)
		script, keys = periodLua, append(slices.Clip(rkeys), counter)
	}
	vals, err := c.Eval(ctx, script, keys, args...).Int64Slice()
	if err != nil {
		return nil, err
	}
	if counter != "" {
		// The reply of a take done on the script's first pass has no
		// clock before the keys' results.
		if len(vals) == len(rkeys)+3 {
			vals = vals[1:]
		}
		vals = vals[:len(rkeys)]
	}
	res := make([]kvstore.OpResult, len(vals))
	for i, v := range vals {
		if v < 0 {
			res[i] = kvstore.OpResult{Remaining: -v - 1}
		} else {
			res[i] = kvstore.OpResult{OK: true, Remaining: v}
		}
	}
	return res, nil
}

// TestMultiLuaMatchesGo is TestLuaMatchesGo for the multi-key script: two
// or three keys, each with its own random refill and n, through random
// sequences of takes (both orders, and the store's own choice), peeks and
// refunds, half of them through the period script with a counter beside
// the buckets that never refuses. At some millisecond between Redis's TIME before and after the
// call (each key's own: see below), kvstore.Refill.Apply on each key's
// reference record must give the script's result for that key, and the
// record the script left, with a
// take applied to every key when every key holds its n and to none
// otherwise (each key then reports its level, as a peek would).
func TestMultiLuaMatchesGo(t *testing.T) {
	s, c := newStore(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(13, 14))
	// Which calls go through the period script: a stream of its own, so
	// that rng draws the sequences it always drew.
	viaPeriod := rand.New(rand.NewPCG(15, 16))
	names := []string{"m0", "m1", "m2"}
	steps, admitted, refused := 0, 0, 0
	for seq := 0; seq < 60; seq++ {
		nk := 2 + rng.IntN(2)
		rkeys := make([]string, nk)
		rs := make([]kvstore.Refill, nk)
		refs := make([]kvstore.Record, nk)
		refOK := make([]bool, nk)
		for i := range nk {
			rkeys[i] = s.Key(names[i])
			rs[i] = randomRefill(rng)
			if err := s.Delete(ctx, names[i]); err != nil {
				t.Fatal(err)
			}
		}
		for range 40 {
			steps++
			op := kvstore.Op(1 + rng.IntN(3))
			if rng.IntN(2) == 0 {
				op = kvstore.OpTake
			}
			ns := make([]int64, nk)
			for i := range nk {
				ns[i] = randomN(rng, rs[i], op)
			}
			if rng.IntN(6) == 0 {
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
			}
			olds := make([]bucketState, nk)
			for i := range nk {
				olds[i] = readState(t, c, rkeys[i])
			}
			before := redisMillis(t, c)
			var (
				res []kvstore.OpResult
				err error
			)
			counter := ""
			if viaPeriod.IntN(2) == 0 {
				counter = s.Key("mc")
			}
			switch {
			case op == kvstore.OpTake && rng.IntN(3) > 0:
				res, err = multiWith(ctx, c, rkeys, rs, ns, takeLetters[rng.IntN(2)], counter)
			case op == kvstore.OpPeek:
				res, err = multiWith(ctx, c, rkeys, rs, ns, "p", counter)
			default:
				ups := make([]kvstore.Update, nk)
				for i := range nk {
					ups[i] = kvstore.Update{Key: names[i], Refill: rs[i], N: ns[i]}
				}
				res = make([]kvstore.OpResult, nk)
				err = s.UpdateMulti(ctx, "", op, ups, res)
			}
			if err != nil {
				t.Fatal(err)
			}
			after := redisMillis(t, c)
			gots := make([]bucketState, nk)
			for i := range nk {
				gots[i] = readState(t, c, rkeys[i])
			}
			read := redisMillis(t, c)
			// Redis before 7.2 reads a fresh clock for each key's PTTL
			// and relative expiry, even within one script, so each key
			// may be read at its own millisecond: every combination is
			// tried.
			span := after - before + 1
			combos := int64(1)
			for range nk {
				combos *= span
			}
			matched := false
			for combo := int64(0); combo < combos && !matched; combo++ {
				ms := make([]int64, nk)
				for i, rest := 0, combo; i < nk; i, rest = i+1, rest/span {
					ms[i] = before + rest%span
				}
				// Each key's level, and whether every key holds its n.
				all := true
				for i := range nk {
					if op == kvstore.OpRefund {
						break
					}
					p, _, _, err := rs[i].Apply(refs[i], refOK[i], ms[i]*1000, kvstore.OpPeek, ns[i])
					if err != nil {
						t.Fatal(err)
					}
					all = all && p.OK
				}
				nexts := make([]kvstore.Record, nk)
				writes := make([]bool, nk)
				matched = true
				for i := 0; i < nk && matched; i++ {
					apply := op
					if op == kvstore.OpTake && !all {
						apply = kvstore.OpPeek
					}
					want, next, write, err := rs[i].Apply(refs[i], refOK[i], ms[i]*1000, apply, ns[i])
					if err != nil {
						t.Fatal(err)
					}
					nexts[i], writes[i] = next, write
					matched = want == res[i] && recordMatches(rs[i], olds[i], gots[i], write, next, ms[i], read)
				}
				if !matched {
					continue
				}
				for i := range nk {
					if writes[i] {
						refs[i], refOK[i] = nexts[i], nexts[i].Value < rs[i].Burst
					}
				}
				if op == kvstore.OpTake {
					if all {
						admitted++
					} else {
						refused++
					}
				}
			}
			if !matched {
				t.Fatalf("sequence %d, refills %+v: op %d ns %v on references %+v (present %v), states %+v: Lua %+v, states after %+v; Apply agrees at no millisecond from %d to %d",
					seq, rs, op, ns, refs, refOK, olds, res, gots, before, after)
			}
		}
	}
	if admitted < steps/8 || refused < steps/8 {
		t.Fatalf("%d of %d steps were admitted takes and %d refused takes; too few to test both", admitted, steps, refused)
	}
}

// TestTakeShortensALongExpiry: a key written under a slow refill expires
// far later than an empty bucket of a faster refill takes to fill. A take
// under the faster refill, by Update or Multi and in either order, leaves
// the key expiring within that fill time, so that a policy changed to a
// faster one does not keep keys for the old one's.
func TestTakeShortensALongExpiry(t *testing.T) {
	s, c := newStore(t)
	ctx := context.Background()
	slow := kvstore.Refill{Burst: 1_000_000_000, Rate: 1} // fills in 1,000 s
	fast := kvstore.Refill{Burst: 10_000_000, Rate: 1}    // fills in 10 s
	fill := (fast.Burst + redistest.RateArg(fast) - 1) / redistest.RateArg(fast)
	for _, letter := range takeLetters {
		for _, multi := range []bool{false, true} {
			for _, k := range []string{"a", "b"} {
				if _, err := s.Update(ctx, k, slow, kvstore.OpTake, 1); err != nil {
					t.Fatal(err)
				}
			}
			var err error
			if multi {
				_, err = multiWith(ctx, c, []string{s.Key("a"), s.Key("b")}, []kvstore.Refill{fast, fast}, []int64{1, 1}, letter, "")
			} else {
				_, err = takeWith(ctx, c, s.Key("a"), fast, 1, letter)
			}
			if err != nil {
				t.Fatal(err)
			}
			got := readState(t, c, s.Key("a"))
			if now := redisMillis(t, c); !got.present || got.e-now > fill {
				t.Errorf("take %s (multi %v) under a refill that fills in %d ms: key %+v at %d", letter, multi, fill, got, now)
			}
			for _, k := range []string{"a", "b"} {
				if err := s.Delete(ctx, k); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// updateLua and multiLua are the engine's update and multi-key scripts,
// and periodLua its period script, which the tests above run with op
// arguments of their own.
var (
	updateLua, multiLua = redistest.Scripts()
	periodLua           = redistest.PeriodScript()
)
