// Package rueidisstore_test checks that rueidisstore and redisstore share
// their records: one script, one record format. It lives here so that
// rueidisstore's module requires neither go-redis nor redisstore.
package rueidisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratekit/ratekit/internal/itest/redisclient"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
)

// slow refills one unit per microsecond of a bucket of 10^15, and big is a
// take from it: a test's milliseconds refill a negligible share of one take.
var slow = kvstore.Refill{Burst: 1e15, Rate: 1}

const big = 1e12

// near reports whether level is at want or above it by less than 1000 s of refill.
func near(level, want int64) bool { return level >= want && level < want+1e9 }

// stores returns a rueidisstore and a redisstore with one prefix of the
// test's own on the shared test Redis; the prefix's keys are removed at
// cleanup.
func stores(t *testing.T) (*rueidisstore.Store, *redisstore.Store) {
	p := redistest.Prefix(t)
	gc := redisclient.Client(t, testenv.RedisAddr(t), p)
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{testenv.RedisAddr(t)}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	rs, err := rueidisstore.New(rc, rueidisstore.Config{Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	gs, err := redisstore.New(gc, redisstore.Config{Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	if rs.Key("k") != gs.Key("k") {
		t.Fatalf("the stores name key k %q and %q", rs.Key("k"), gs.Key("k"))
	}
	return rs, gs
}

// TestSharesRecords: each store reads and updates the other's keys.
func TestSharesRecords(t *testing.T) {
	rs, gs := stores(t)
	ctx := context.Background()
	for i := range int64(3) {
		if res, err := gs.Update(ctx, "k", slow, kvstore.OpTake, big); err != nil || !near(res.Remaining, slow.Burst-(2*i+1)*big) {
			t.Fatalf("redisstore take %d = %+v, %v", i, res, err)
		}
		if res, err := rs.Update(ctx, "k", slow, kvstore.OpTake, big); err != nil || !near(res.Remaining, slow.Burst-(2*i+2)*big) {
			t.Fatalf("rueidisstore take %d = %+v, %v", i, res, err)
		}
	}
	rec := kvstore.Record{Value: 7, Time: 1795327323488854}
	if err := gs.Set(ctx, "r", rec, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := rs.Get(ctx, "r"); err != nil || !ok || got != rec {
		t.Fatalf("rueidisstore Get of redisstore's record = %+v, %v, %v", got, ok, err)
	}
}

// TestUpdateMultiSharesRecords: the two stores run one multi-key script
// over the same keys, grouped or not.
func TestUpdateMultiSharesRecords(t *testing.T) {
	rs, gs := stores(t)
	ctx := context.Background()
	for _, g := range []string{"", "org-7"} {
		u := []kvstore.Update{{Key: "a", Refill: slow, N: big}, {Key: "b", Refill: slow, N: 3 * big}}
		res := make([]kvstore.OpResult, 2)
		if err := rs.UpdateMulti(ctx, g, kvstore.OpTake, u, res); err != nil || !res[0].OK || !res[1].OK {
			t.Fatalf("group %q: rueidisstore take = %+v, %v", g, res, err)
		}
		if err := gs.UpdateMulti(ctx, g, kvstore.OpTake, u, res); err != nil || !res[0].OK || !res[1].OK {
			t.Fatalf("group %q: redisstore take = %+v, %v", g, res, err)
		}
		if err := rs.UpdateMulti(ctx, g, kvstore.OpPeek, u, res); err != nil || !near(res[0].Remaining, slow.Burst-2*big) || !near(res[1].Remaining, slow.Burst-6*big) {
			t.Fatalf("group %q: peek after a take through each store = %+v, %v; want about %d and %d", g, res, err, int64(slow.Burst-2*big), int64(slow.Burst-6*big))
		}
	}
}
