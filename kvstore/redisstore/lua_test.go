package redisstore_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit/internal/redisscript"
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
	v, err := c.Eval(ctx, redisscript.Update, []string{rkey}, r.Max, redisscript.RateArg(r), n, letter).Int64()
	if err != nil {
		return kvstore.OpResult{}, err
	}
	if v < 0 {
		return kvstore.OpResult{Value: -v - 1}, nil
	}
	return kvstore.OpResult{OK: true, Value: v}, nil
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
		max := 1 + rng.Int64N(kvstore.MaxValue)
		if rng.IntN(2) == 0 {
			max = 1 + rng.Int64N(10_000)
		}
		r := kvstore.Refill{Max: max, Rate: 1 + rng.Int64N(min(max, 5000))}
		switch rng.IntN(4) {
		case 0:
			r.Rate = max // full again within a microsecond
		case 1:
			// A slow refill of a small bucket: a key lives up to
			// max/1000 ms, so pauses of milliseconds find buckets
			// that refilled while their key lives on.
			r = kvstore.Refill{Max: 2000 + rng.Int64N(8000), Rate: 1}
			max = r.Max
		}
		rate := redisscript.RateArg(r)
		if err := s.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
		var ref kvstore.Record
		refOK := false
		for range 40 {
			steps++
			op := kvstore.Op(1 + rng.IntN(3))
			n := 1 + rng.Int64N(max)
			if rng.IntN(2) == 0 {
				n = 1 + rng.Int64N(1+max/8)
			}
			if op == kvstore.OpRefund && rng.IntN(4) == 0 {
				n = 1 + rng.Int64N(1<<62)
			}
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
				switch {
				case !write:
					// Nothing written: the key is as it was, or gone
					// because the bucket filled up meanwhile.
					matched = got == old || !got.present
				case next.Value >= r.Max:
					matched = !got.present
				case got.present:
					// The debt the record encodes is Apply's, and the key
					// expires no earlier than the bucket is full (w >= 0)
					// and no later than an empty bucket's fill time.
					debt := r.Max - next.Value
					matched = got.w >= 0 && (got.e-ms)*rate-got.w == debt && got.e-ms <= (r.Max+rate-1)/rate
				default:
					// Gone: only when the bucket was full again before
					// the state was read.
					debt := r.Max - next.Value
					matched = ms+(debt+rate-1)/rate <= read
				}
				if matched && write {
					ref, refOK = next, next.Value < r.Max
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
