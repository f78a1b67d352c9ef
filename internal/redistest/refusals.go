//go:build !js

package redistest

import (
	"context"
	"regexp"
	"strconv"
	"testing"

	"github.com/ratekit/ratekit/kvstore"
)

// A Store is a Redis store of ratekit, on one key or several.
type Store interface {
	kvstore.Atomic
	kvstore.MultiAtomic
}

// Scripts returns how many scripts the server has run (EVALSHA and EVAL),
// from INFO commandstats.
func (s *Server) Scripts() int64 {
	s.t.Helper()
	stats := command(cliBin(s.t), s.Addr, "INFO", "commandstats")
	var n int64
	for _, cmd := range []string{"evalsha", "eval"} {
		if m := regexp.MustCompile(`cmdstat_` + cmd + `:calls=(\d+)`).FindStringSubmatch(stats); m != nil {
			v, _ := strconv.ParseInt(m[1], 10, 64)
			n += v
		}
	}
	return n
}

// CheckRefusalsRunNoScript fails t unless s, a store on srv and nothing
// else, decides without a script the takes of a key (and of keys together)
// whose last take was refused and that stay refused, and every peek, each
// reporting its level; and runs the script again for the first take that
// fits.
// cyclomatic: one scenario whose branches are its t.Fatalf checks, in order.
func CheckRefusalsRunNoScript(t *testing.T, srv *Server, s Store) {
	t.Helper()
	ctx := context.Background()
	// 1,000 units a millisecond: a take of 10^8 from "a" waits 100 s once
	// it is empty, while "b" has plenty.
	slow, plenty := kvstore.Refill{Burst: 1e9, Rate: 1}, kvstore.Refill{Burst: 1e15, Rate: 1}
	if res, err := s.Update(ctx, "a", slow, kvstore.OpTake, slow.Burst); err != nil || !res.OK {
		t.Fatalf("exhausting a: %+v, %v", res, err)
	}
	both := []kvstore.Update{{Key: "a", Refill: slow, N: 1e8}, {Key: "b", Refill: plenty, N: 1e8}}
	res := make([]kvstore.OpResult, 2)
	if r, err := s.Update(ctx, "a", slow, kvstore.OpTake, 1e8); err != nil || r.OK {
		t.Fatalf("the first refused take: %+v, %v", r, err)
	}
	if err := s.UpdateMulti(ctx, "", kvstore.OpTake, both, res); err != nil || res[0].OK || !res[1].OK {
		t.Fatalf("the first refused composite take: %+v, %v", res, err)
	}
	before := srv.Scripts()
	last := int64(-1)
	for i := range 30 {
		op := kvstore.OpTake
		if i%3 == 0 {
			op = kvstore.OpPeek
		}
		r, err := s.Update(ctx, "a", slow, op, 1e8)
		if err != nil || r.OK || r.Remaining < last || r.Remaining >= 1e8 {
			t.Fatalf("op %d of 10^8 on an empty bucket: %+v, %v (level before %d)", op, r, err, last)
		}
		last = r.Remaining
		if err := s.UpdateMulti(ctx, "", op, both, res); err != nil || res[0].OK || res[0].Remaining >= 1e8 || !res[1].OK || res[1].Remaining != plenty.Burst {
			t.Fatalf("op %d of 10^8 on an empty and a full bucket: %+v, %v", op, res, err)
		}
	}
	if r, err := s.Update(ctx, "a", slow, kvstore.OpPeek, 1); err != nil || !r.OK || r.Remaining < last {
		t.Fatalf("a peek of 1: %+v, %v", r, err)
	}
	if n := srv.Scripts() - before; n != 0 {
		t.Fatalf("refused takes and peeks ran %d scripts, want none", n)
	}
	both[0].N, both[1].N = 1, 1
	for want := int64(1); want <= 2; want++ {
		if r, err := s.Update(ctx, "a", slow, kvstore.OpTake, 1); err != nil || !r.OK {
			t.Fatalf("a take of 1: %+v, %v", r, err)
		}
		if err := s.UpdateMulti(ctx, "", kvstore.OpTake, both, res); err != nil || !res[0].OK || !res[1].OK {
			t.Fatalf("a take of 1 from each: %+v, %v", res, err)
		}
		if n := srv.Scripts() - before; n != 2*want {
			t.Fatalf("%d takes and %d composite takes that fit ran %d scripts", want, want, n)
		}
	}
}
