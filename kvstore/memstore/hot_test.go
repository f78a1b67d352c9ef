package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ratekit/ratekit/kvstore"
)

// TestHotEntryMatchesModel runs random operations on keys of one shard,
// where a key updated twice in a row becomes the shard's hot entry, and
// checks every result against a model of the store's semantics (a map of
// records and expiries, updated by kvstore.Refill.Apply): reads, writes,
// deletions, UpdateMulti and the eviction's view of expiry see the hot
// record, not the one left in its entry.
func TestHotEntryMatchesModel(t *testing.T) {
	var now int64 = 1_700_000_000_000_000_000
	s, err := New(Config{Now: func() time.Time { return time.Unix(0, now) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Four keys of the scope "p:" in one shard, and one key of the store's
	// own scope in that shard.
	sc := s.Prefixed("p:").(*Scope)
	var keys []string
	for i := 0; len(keys) < 4; i++ {
		k := fmt.Sprint("k", i)
		if len(keys) == 0 || s.shard(maphash.String(s.seed, k)) == s.shard(maphash.String(s.seed, keys[0])) {
			keys = append(keys, k)
		}
	}
	type state struct {
		rec     kvstore.Record
		expires int64
	}
	model := map[string]state{}
	live := func(k string) (kvstore.Record, bool) {
		st, ok := model[k]
		if !ok || now >= st.expires {
			return kvstore.Record{}, false
		}
		return st.rec, true
	}
	update := func(k string, r kvstore.Refill, op kvstore.Op, n int64) (kvstore.OpResult, error) {
		rec, ok := live(k)
		res, next, write, err := r.Apply(rec, ok, micros(now), op, n)
		switch {
		case err == nil && write && next.Value < r.Burst:
			model[k] = state{next, expiry(r, next)}
		case !ok || err == nil && write:
			delete(model, k)
		}
		return res, err
	}
	rng := rand.New(rand.NewPCG(4, 2))
	r := kvstore.Refill{Burst: 100, Rate: 2}
	for i := range 20_000 {
		k := keys[rng.IntN(len(keys))]
		if rng.IntN(4) > 0 {
			k = keys[0] // mostly one key, so that it is often hot
		}
		switch p := rng.IntN(20); {
		case p < 12:
			op := []kvstore.Op{kvstore.OpTake, kvstore.OpTake, kvstore.OpPeek, kvstore.OpRefund}[rng.IntN(4)]
			n := 1 + rng.Int64N(40)
			got, gotErr := sc.Update(ctx, k, r, op, n)
			want, wantErr := update(k, r, op, n)
			if got != want || fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
				t.Fatalf("step %d: Update(%s, %v, %d) = %+v, %v; want %+v, %v", i, k, op, n, got, gotErr, want, wantErr)
			}
		case p < 14:
			ok, remaining, err := sc.Take(ctx, k, r, 7)
			want, wantErr := update(k, r, kvstore.OpTake, 7)
			if ok != want.OK || remaining != want.Remaining || fmt.Sprint(err) != fmt.Sprint(wantErr) {
				t.Fatalf("step %d: Take(%s) = %v, %d, %v; want %+v, %v", i, k, ok, remaining, err, want, wantErr)
			}
		case p < 16:
			rec, ok, _ := sc.Get(ctx, k)
			wrec, wok := live(k)
			if rec != wrec || ok != wok {
				t.Fatalf("step %d: Get(%s) = %+v, %v; want %+v, %v", i, k, rec, ok, wrec, wok)
			}
		case p < 17:
			rec := kvstore.Record{Value: rng.Int64N(100), Time: micros(now)}
			ttl := time.Duration(1+rng.IntN(100)) * time.Microsecond
			sc.Set(ctx, k, rec, ttl)
			model[k] = state{rec, now + int64(max(ttl, time.Millisecond))}
		case p < 18:
			sc.Delete(ctx, k)
			delete(model, k)
		case p < 19:
			// A peek at two keys: its results are each key's peek.
			k2 := keys[(rng.IntN(len(keys)-1)+1+slices.Index(keys, k))%len(keys)]
			u := []kvstore.Update{{Key: k, Refill: r, N: 3}, {Key: k2, Refill: r, N: 50}}
			res := make([]kvstore.OpResult, 2)
			err := sc.UpdateMulti(ctx, "", kvstore.OpPeek, u, res)
			w1, _ := update(k, r, kvstore.OpPeek, 3)
			w2, _ := update(k2, r, kvstore.OpPeek, 50)
			if err != nil || res[0] != w1 || res[1] != w2 {
				t.Fatalf("step %d: UpdateMulti peek (%s, %s) = %+v, %v; want %+v, %+v", i, k, k2, res, err, w1, w2)
			}
		default:
			// The store's own key in the same shard: another scope's
			// update writes the hot record back.
			s.Update(ctx, keys[0], r, kvstore.OpTake, 1)
		}
		now += int64(time.Duration(rng.IntN(30)) * time.Microsecond)
	}
}
