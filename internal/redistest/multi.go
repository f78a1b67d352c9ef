//go:build !js

package redistest

import (
	"context"
	"errors"
	"testing"

	"github.com/ratekit/ratekit/kvstore"
)

// CheckMultiArguments runs UpdateMulti on s with two sets of policies and
// costs in turn, and with every op, and fails t unless each call's results
// follow its own arguments: a store that reuses the arguments of an earlier
// call (a cache of formatted arguments, say) must notice when they change.
// The keys live under prefix.
func CheckMultiArguments(t *testing.T, s kvstore.MultiAtomic, prefix string) {
	t.Helper()
	ctx := context.Background()
	const big = 1_000_000_000_000 // refills 1 per µs: 10^6 in a second, far below the levels checked
	a := kvstore.Refill{Burst: big, Rate: 1}
	b := kvstore.Refill{Burst: 2 * big, Rate: 1}
	res := make([]kvstore.OpResult, 2)
	step := func(name string, op kvstore.Op, updates []kvstore.Update, want ...int64) {
		t.Helper()
		if err := s.UpdateMulti(ctx, "", op, updates, res); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for i, w := range want {
			if !res[i].OK || res[i].Remaining < w || res[i].Remaining > w+10_000_000 {
				t.Fatalf("%s: key %d: %+v, want OK and level %d (plus at most 10 s of refill)", name, i, res[i], w)
			}
		}
	}
	first := []kvstore.Update{{Key: prefix + "a1", Refill: a, N: big / 2}, {Key: prefix + "a2", Refill: b, N: big / 4}}
	second := []kvstore.Update{{Key: prefix + "b1", Refill: b, N: big}, {Key: prefix + "b2", Refill: a, N: big / 8}}
	step("first take", kvstore.OpTake, first, big/2, 2*big-big/4)
	step("second take", kvstore.OpTake, second, big, big-big/8)
	step("first take again", kvstore.OpTake, first, 0, 2*big-big/2)
	step("second peek", kvstore.OpPeek, second, big, big-big/8)
	first[0].N, first[1].N = big/4, big/4
	step("first refund", kvstore.OpRefund, first, big/4, 2*big-big/4)
	step("first peek", kvstore.OpPeek, first, big/4, 2*big-big/4)
}

// CheckCluster checks UpdateMulti on s, a store on a Redis Cluster client:
// s reports Partitioned; keys of the empty group in different slots fail
// with kvstore.ErrCrossPartition before anything is sent (sent, when not
// nil, counts the commands the client sent); keys that share a slot
// through their own hash tag need no group; and a group puts every key in
// one slot.
func CheckCluster(t *testing.T, s kvstore.MultiAtomic, sent func() int64) {
	t.Helper()
	if !s.Partitioned() {
		t.Fatal("a cluster store does not report Partitioned")
	}
	ctx := context.Background()
	res := make([]kvstore.OpResult, 2)
	// "a" and "b" hash to slots 15495 and 3300.
	two := []kvstore.Update{{Key: "a", Refill: Take1, N: 1}, {Key: "b", Refill: Take1, N: 1}}
	if err := s.UpdateMulti(ctx, "", kvstore.OpTake, two, res); !errors.Is(err, kvstore.ErrCrossPartition) {
		t.Fatalf("keys of two slots: err = %v, want ErrCrossPartition", err)
	}
	if sent != nil {
		if n := sent(); n != 0 {
			t.Fatalf("a refused call sent %d commands", n)
		}
	}
	same := []kvstore.Update{{Key: "x", Refill: Take1, N: 1}, {Key: "x}y", Refill: Take1, N: 1}}
	if err := s.UpdateMulti(ctx, "", kvstore.OpTake, same, res); err != nil {
		t.Fatalf("keys of one slot: %v", err)
	}
	for _, g := range []string{"user-1", "org-7", "{odd}"} {
		if err := s.UpdateMulti(ctx, g, kvstore.OpTake, two, res); err != nil || !res[0].OK || !res[1].OK {
			t.Fatalf("group %q: %+v, %v", g, res, err)
		}
	}
}

// NewStore returns a function that builds a store with newStore under a
// prefix of the test's own (see Prefix), failing the test on an error: a
// kvstore conformance suite's factory.
func NewStore(newStore func(prefix string) (kvstore.Store, error)) func(*testing.T) kvstore.Store {
	return func(t *testing.T) kvstore.Store {
		t.Helper()
		s, err := newStore(Prefix(t))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}
