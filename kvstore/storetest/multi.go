package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratekit/kvstore"
)

// runMulti checks the [kvstore.MultiAtomic] contract of a store that
// implements it. On a partitioned store
// every call names a group, so that its keys share a partition.
func runMulti(t *testing.T, newStore func(t *testing.T) kvstore.Store) {
	multiStore := func(t *testing.T) kvstore.MultiAtomic { return newStore(t).(kvstore.MultiAtomic) }
	t.Run("AllOrNothing", func(t *testing.T) { testMultiAllOrNothing(t, multiStore(t)) })
	t.Run("InvalidArguments", func(t *testing.T) { testMultiInvalid(t, multiStore(t)) })
	t.Run("Groups", func(t *testing.T) { testMultiGroups(t, multiStore(t)) })
	t.Run("Concurrent", func(t *testing.T) { testMultiConcurrent(t, multiStore(t)) })
}

// group returns the group a test uses on s: none unless s is partitioned.
func group(s kvstore.MultiAtomic) string {
	if s.Partitioned() {
		return "storetest"
	}
	return ""
}

func multi(t *testing.T, s kvstore.MultiAtomic, g string, op kvstore.Op, u ...kvstore.Update) []kvstore.OpResult {
	t.Helper()
	res := make([]kvstore.OpResult, len(u))
	if err := s.UpdateMulti(ctx(t), g, op, u, res); err != nil {
		t.Fatalf("UpdateMulti(%q, op %d, %+v): %v", g, op, u, err)
	}
	return res
}

func testMultiAllOrNothing(t *testing.T, s kvstore.MultiAtomic) {
	g := group(s)
	big := kvstore.Refill{Burst: 100 * unit, Rate: 1}
	res := multi(t, s, g, kvstore.OpTake, kvstore.Update{Key: "a", Refill: slow, N: 4 * unit}, kvstore.Update{Key: "b", Refill: big, N: 30 * unit})
	if !res[0].OK || !near(res[0].Remaining, 6*unit) || !res[1].OK || !near(res[1].Remaining, 70*unit) {
		t.Fatalf("take 4 of 10 and 30 of 100 = %+v; want OK 6 and OK 70 units", res)
	}
	// b (given first: results follow the input order) lacks 80; a, which
	// holds 6, must keep them.
	res = multi(t, s, g, kvstore.OpTake, kvstore.Update{Key: "b", Refill: big, N: 80 * unit}, kvstore.Update{Key: "a", Refill: slow, N: 5 * unit})
	if res[0].OK || !near(res[0].Remaining, 70*unit) || !res[1].OK || !near(res[1].Remaining, 6*unit) {
		t.Fatalf("refused take = %+v; want b refused at 70 and a able at 6 units", res)
	}
	res = multi(t, s, g, kvstore.OpPeek, kvstore.Update{Key: "a", Refill: slow, N: 7 * unit}, kvstore.Update{Key: "b", Refill: big, N: 70 * unit})
	if res[0].OK || !near(res[0].Remaining, 6*unit) || !res[1].OK || !near(res[1].Remaining, 70*unit) {
		t.Fatalf("peek after the refused take = %+v; want a at 6 (lacking 7), b at 70", res)
	}
	res = multi(t, s, g, kvstore.OpRefund, kvstore.Update{Key: "a", Refill: slow, N: 100 * unit}, kvstore.Update{Key: "b", Refill: big, N: 10 * unit})
	if !res[0].OK || res[0].Remaining != 10*unit || !res[1].OK || !near(res[1].Remaining, 80*unit) {
		t.Fatalf("refund = %+v; want a full at 10 and b at 80 units", res)
	}
	// A take that a single Update sees: the multi-key step wrote both.
	if r := update(t, s, "c", slow, kvstore.OpTake, unit); !r.OK {
		t.Fatalf("take of c = %+v", r)
	}
	if g == "" {
		if r := update(t, s, "b", big, kvstore.OpPeek, unit); !near(r.Remaining, 80*unit) {
			t.Fatalf("Update sees b at %d units, want 80", r.Remaining/unit)
		}
	}
}

func testMultiInvalid(t *testing.T, s kvstore.MultiAtomic) {
	g := group(s)
	ok := kvstore.Update{Key: "a", Refill: slow, N: unit}
	for name, tc := range map[string]struct {
		op   kvstore.Op
		u    []kvstore.Update
		nres int
		want error
	}{
		"no updates":      {kvstore.OpTake, nil, 0, kvstore.ErrInvalidOp},
		"results short":   {kvstore.OpTake, []kvstore.Update{ok, {Key: "b", Refill: slow, N: unit}}, 1, kvstore.ErrInvalidOp},
		"unknown op":      {0, []kvstore.Update{ok}, 1, kvstore.ErrInvalidOp},
		"n above max":     {kvstore.OpTake, []kvstore.Update{ok, {Key: "b", Refill: slow, N: 11 * unit}}, 2, kvstore.ErrInvalidOp},
		"zero n":          {kvstore.OpTake, []kvstore.Update{ok, {Key: "b", Refill: slow}}, 2, kvstore.ErrInvalidOp},
		"invalid refill":  {kvstore.OpTake, []kvstore.Update{ok, {Key: "b", Refill: kvstore.Refill{Burst: 1, Rate: 2}, N: 1}}, 2, kvstore.ErrInvalidRefill},
		"duplicate key":   {kvstore.OpTake, []kvstore.Update{ok, {Key: "b", Refill: slow, N: unit}, ok}, 3, kvstore.ErrDuplicateKey},
		"duplicate, peek": {kvstore.OpPeek, []kvstore.Update{ok, ok}, 2, kvstore.ErrDuplicateKey},
	} {
		if err := s.UpdateMulti(ctx(t), g, tc.op, tc.u, make([]kvstore.OpResult, tc.nres)); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", name, err, tc.want)
		}
	}
	if res := multi(t, s, g, kvstore.OpPeek, ok); !res[0].OK || res[0].Remaining != 10*unit {
		t.Errorf("after refused calls, a = %+v; want untouched (full)", res[0])
	}
}

func testMultiGroups(t *testing.T, s kvstore.MultiAtomic) {
	u := func(n int64) kvstore.Update { return kvstore.Update{Key: "k", Refill: slow, N: n * unit} }
	multi(t, s, "g1", kvstore.OpTake, u(1))
	multi(t, s, "g2", kvstore.OpTake, u(2))
	if !s.Partitioned() {
		multi(t, s, "", kvstore.OpTake, u(3))
	}
	// Groups whose encodings could meet if the store only concatenated.
	multi(t, s, "g1}", kvstore.OpTake, u(4))
	for _, tc := range []struct {
		g    string
		want int64
	}{{"g1", 9}, {"g2", 8}, {"g1}", 6}, {"g", 10}} {
		if res := multi(t, s, tc.g, kvstore.OpPeek, u(1)); !near(res[0].Remaining, tc.want*unit) {
			t.Errorf("group %q: k at %d units, want %d", tc.g, res[0].Remaining/unit, tc.want)
		}
	}
	if !s.Partitioned() {
		if r := update(t, s, "k", slow, kvstore.OpPeek, unit); !near(r.Remaining, 7*unit) {
			t.Errorf("ordinary key k at %d units, want 7", r.Remaining/unit)
		}
	}
}

// testMultiConcurrent runs 64 workers that take one token at a time from
// random sets of 1 to 3 of 4 keys, given in random order, mixed (on a store
// that is not partitioned) with single-key takes of the same keys, until
// every key is nearly empty. Each key's final level must be its capacity
// less exactly the takes that reported success: a call that took from some
// keys and not others, or a lost update, shows. A deadlock fails at the
// context's deadline.
func testMultiConcurrent(t *testing.T, s kvstore.MultiAtomic) {
	const workers, perWorker, capacity = 64, 40, 300
	g := group(s)
	r := kvstore.Refill{Burst: capacity * unit, Rate: 1}
	keys := []string{"w", "x", "y", "z"}
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var (
		mu    sync.Mutex
		taken = map[string]int64{}
		errs  []error
		wg    sync.WaitGroup
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWorker; i++ {
				perm := rand.Perm(len(keys))[:1+rand.IntN(3)]
				if g == "" && len(perm) == 1 {
					res, err := s.Update(c, keys[perm[0]], r, kvstore.OpTake, unit)
					mu.Lock()
					if err != nil {
						errs = append(errs, err)
					} else if res.OK {
						taken[keys[perm[0]]]++
					}
					mu.Unlock()
					continue
				}
				u := make([]kvstore.Update, len(perm))
				for j, p := range perm {
					u[j] = kvstore.Update{Key: keys[p], Refill: r, N: unit}
				}
				res := make([]kvstore.OpResult, len(u))
				err := s.UpdateMulti(c, g, kvstore.OpTake, u, res)
				mu.Lock()
				all := true
				for _, x := range res {
					all = all && x.OK
				}
				switch {
				case err != nil:
					errs = append(errs, err)
				case all:
					for _, x := range u {
						taken[x.Key]++
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d errors, first: %v", len(errs), errs[0])
	}
	var total int64
	for _, k := range keys {
		res := multi(t, s, g, kvstore.OpPeek, kvstore.Update{Key: k, Refill: r, N: 1})
		if got, want := res[0].Remaining/unit, capacity-taken[k]; got != want {
			t.Errorf("key %s: level %d tokens, want %d (capacity less %d successful takes)", k, got, want, taken[k])
		}
		total += taken[k]
	}
	if total < capacity {
		t.Errorf("only %d takes succeeded; the test did not contend: %v", total, fmt.Sprint(taken))
	}
}
