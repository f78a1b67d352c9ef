package storetest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
)

// runPeriods checks the [kvstore.PeriodCounter] contract, on the store's
// own clock: the bounds are computed around this process's clock, hours
// wide, so that a store clock within half an hour of it picks the period
// the test expects.
func runPeriods(t *testing.T, newStore func(t *testing.T) kvstore.Store) {
	periodStore := func(t *testing.T) kvstore.PeriodCounter { return newStore(t).(kvstore.PeriodCounter) }
	t.Run("TakePeekRefund", func(t *testing.T) { testPeriodTakePeekRefund(t, periodStore(t)) })
	t.Run("WithBuckets", func(t *testing.T) { testPeriodWithBuckets(t, periodStore(t)) })
	t.Run("PeriodChoice", func(t *testing.T) { testPeriodChoice(t, periodStore(t)) })
	t.Run("ClockSkew", func(t *testing.T) { testPeriodClockSkew(t, periodStore(t)) })
	t.Run("InvalidArguments", func(t *testing.T) { testPeriodInvalid(t, periodStore(t)) })
	t.Run("Concurrent", func(t *testing.T) { testPeriodConcurrent(t, periodStore(t)) })
}

// testStart is the instant the periods of the tests are computed around,
// read once, so that bounds computed by different calls meet exactly.
var testStart = time.Now()

// around returns bounds whose boundaries are the given offsets from
// testStart.
func around(quota int64, offsets ...time.Duration) *kvstore.PeriodBounds {
	p := &kvstore.PeriodBounds{Quota: quota}
	for i, o := range offsets {
		p.Bounds[i] = testStart.Add(o).UnixMicro()
	}
	return p
}

// centred returns bounds whose current period is [−1h, +1h) from testStart.
func centred(quota int64) *kvstore.PeriodBounds {
	return around(quota, -2*time.Hour, -time.Hour, time.Hour, 2*time.Hour)
}

func counter(key string, p *kvstore.PeriodBounds, n int64) kvstore.Update {
	return kvstore.Update{Key: key, Period: p, N: n}
}

func wantCount(t *testing.T, what string, r kvstore.OpResult, ok bool, used, remaining int64, period int) {
	t.Helper()
	if r.OK != ok || r.Used != used || r.Remaining != remaining || r.Period != period {
		t.Fatalf("%s = %+v; want OK %v, Used %d, Remaining %d, Period %d", what, r, ok, used, remaining, period)
	}
	if now := time.Now().UnixMicro(); r.Now < now-int64(30*time.Minute/time.Microsecond) || r.Now > now+int64(30*time.Minute/time.Microsecond) {
		t.Fatalf("%s: Now %d µs, more than 30 minutes from this process's clock %d", what, r.Now, now)
	}
}

func testPeriodTakePeekRefund(t *testing.T, s kvstore.PeriodCounter) {
	if !s.CountsPeriods() {
		t.Fatal("CountsPeriods() = false for a store that implements kvstore.PeriodCounter")
	}
	g := group(s)
	p := centred(5)
	wantCount(t, "peek of a new key", multi(t, s, g, kvstore.OpPeek, counter("c", p, 5))[0], true, 0, 5, 2)
	wantCount(t, "take 3 of 5", multi(t, s, g, kvstore.OpTake, counter("c", p, 3))[0], true, 3, 2, 2)
	wantCount(t, "take 3 more", multi(t, s, g, kvstore.OpTake, counter("c", p, 3))[0], false, 3, 2, 2)
	wantCount(t, "peek 2", multi(t, s, g, kvstore.OpPeek, counter("c", p, 2))[0], true, 3, 2, 2)
	wantCount(t, "take 2", multi(t, s, g, kvstore.OpTake, counter("c", p, 2))[0], true, 5, 0, 2)
	// The quota is an argument: a smaller one leaves nothing and keeps
	// the count, a larger one leaves more.
	small, large := *p, *p
	small.Quota, large.Quota = 3, 9
	wantCount(t, "peek under a smaller quota", multi(t, s, g, kvstore.OpPeek, counter("c", &small, 1))[0], false, 5, 0, 2)
	wantCount(t, "take under a larger quota", multi(t, s, g, kvstore.OpTake, counter("c", &large, 4))[0], true, 9, 0, 2)
	wantCount(t, "refund 2", multi(t, s, g, kvstore.OpRefund, counter("c", p, 2))[0], true, 7, 0, 2)
	wantCount(t, "refund 100", multi(t, s, g, kvstore.OpRefund, counter("c", p, 100))[0], true, 0, 5, 2)
	wantCount(t, "refund of nothing", multi(t, s, g, kvstore.OpRefund, counter("c", p, 1))[0], true, 0, 5, 2)
	wantCount(t, "take after the refunds", multi(t, s, g, kvstore.OpTake, counter("c", p, 5))[0], true, 5, 0, 2)
}

// testPeriodWithBuckets: one call takes from buckets and counters all or
// nothing.
func testPeriodWithBuckets(t *testing.T, s kvstore.PeriodCounter) {
	g := group(s)
	p := centred(10)
	bucket := func(n int64) kvstore.Update { return kvstore.Update{Key: "b", Refill: slow, N: n * unit} }
	res := multi(t, s, g, kvstore.OpTake, bucket(4), counter("c", p, 4))
	if !res[0].OK || !near(res[0].Remaining, 6*unit) || res[0].Period != 0 || res[0].Used != 0 {
		t.Fatalf("bucket part of the first take = %+v; want OK at 6 units and no period fields", res[0])
	}
	wantCount(t, "counter part of the first take", res[1], true, 4, 6, 2)
	// The bucket lacks: the counter keeps its count and reports it could.
	res = multi(t, s, g, kvstore.OpTake, counter("c", p, 5), bucket(7))
	wantCount(t, "counter of a take the bucket refused", res[0], true, 4, 6, 2)
	if res[1].OK || !near(res[1].Remaining, 6*unit) {
		t.Fatalf("bucket of a refused take = %+v; want refused at 6 units", res[1])
	}
	// The counter lacks: the bucket keeps its level.
	res = multi(t, s, g, kvstore.OpTake, bucket(5), counter("c", p, 7))
	if !res[0].OK || !near(res[0].Remaining, 6*unit) {
		t.Fatalf("bucket of a take the counter refused = %+v; want able at 6 units", res[0])
	}
	wantCount(t, "counter that refused", res[1], false, 4, 6, 2)
	res = multi(t, s, g, kvstore.OpRefund, bucket(100), counter("c", p, 1))
	if !res[0].OK || res[0].Remaining != 10*unit {
		t.Fatalf("bucket refund = %+v; want full at 10 units", res[0])
	}
	wantCount(t, "counter refund", res[1], true, 3, 7, 2)
}

// testPeriodChoice: the store counts in the period that contains its
// clock; a record of an earlier period counts zero, one of a later period
// keeps its count.
func testPeriodChoice(t *testing.T, s kvstore.PeriodCounter) {
	g := group(s)
	first := around(10, -time.Hour, time.Hour, 2*time.Hour, 3*time.Hour)
	wantCount(t, "take in the first of three periods", multi(t, s, g, kvstore.OpTake, counter("c", first, 2))[0], true, 2, 8, 1)
	last := around(10, -3*time.Hour, -2*time.Hour, -time.Hour, time.Hour)
	wantCount(t, "peek in the last of three periods, same start", multi(t, s, g, kvstore.OpPeek, counter("c", last, 1))[0], true, 2, 8, 3)
	// A period that started after the record's: a new period, from zero.
	later := around(10, -2*time.Hour, -30*time.Minute, time.Hour, 2*time.Hour)
	wantCount(t, "take in a period that started later", multi(t, s, g, kvstore.OpTake, counter("c", later, 3))[0], true, 3, 7, 2)
	// A period that started before the record's (the periods moved back):
	// the count stays, and goes on in the record's period.
	earlier := around(10, -4*time.Hour, -3*time.Hour, 3*time.Hour, 4*time.Hour)
	wantCount(t, "take in a period that started earlier", multi(t, s, g, kvstore.OpTake, counter("c", earlier, 1))[0], true, 4, 6, 2)
	wantCount(t, "peek in the record's period", multi(t, s, g, kvstore.OpPeek, counter("c", later, 1))[0], true, 4, 6, 2)
}

// testPeriodClockSkew: a store clock outside the bounds fails the call
// before anything changes, buckets of the call included.
func testPeriodClockSkew(t *testing.T, s kvstore.PeriodCounter) {
	g := group(s)
	future := around(10, time.Hour, 2*time.Hour, 3*time.Hour, 4*time.Hour)
	past := around(10, -4*time.Hour, -3*time.Hour, -2*time.Hour, -time.Hour)
	for _, op := range []kvstore.Op{kvstore.OpTake, kvstore.OpPeek, kvstore.OpRefund} {
		for _, p := range []*kvstore.PeriodBounds{future, past} {
			u := []kvstore.Update{{Key: "b", Refill: slow, N: unit}, counter("c", centred(10), 1), counter("d", p, 1)}
			if err := s.UpdateMulti(ctx(t), g, op, u, make([]kvstore.OpResult, 3)); !errors.Is(err, ratekit.ErrClockSkew) {
				t.Fatalf("op %d with bounds %v: err = %v, want ErrClockSkew", op, p.Bounds, err)
			}
		}
	}
	res := multi(t, s, g, kvstore.OpPeek, kvstore.Update{Key: "b", Refill: slow, N: unit}, counter("c", centred(10), 1))
	if res[0].Remaining != 10*unit || res[1].Used != 0 {
		t.Fatalf("after calls refused for skew: %+v; want the bucket full and the counter at zero", res)
	}
}

func testPeriodInvalid(t *testing.T, s kvstore.PeriodCounter) {
	g := group(s)
	good := centred(5)
	backwards := &kvstore.PeriodBounds{Bounds: [4]int64{4, 3, 2, 1}, Quota: 5}
	equal := &kvstore.PeriodBounds{Bounds: [4]int64{1, 2, 2, 3}, Quota: 5}
	negative := &kvstore.PeriodBounds{Bounds: [4]int64{-1, 2, 3, 4}, Quota: 5}
	late := &kvstore.PeriodBounds{Bounds: [4]int64{1, 2, 3, kvstore.MaxPeriodBound + 1}, Quota: 5}
	noQuota, bigQuota := *good, *good
	noQuota.Quota, bigQuota.Quota = 0, kvstore.MaxValue+1
	for name, tc := range map[string]struct {
		op   kvstore.Op
		u    kvstore.Update
		want error
	}{
		"bounds backwards":  {kvstore.OpTake, counter("c", backwards, 1), kvstore.ErrInvalidPeriod},
		"bounds equal":      {kvstore.OpPeek, counter("c", equal, 1), kvstore.ErrInvalidPeriod},
		"bound negative":    {kvstore.OpTake, counter("c", negative, 1), kvstore.ErrInvalidPeriod},
		"bound past 2^53":   {kvstore.OpRefund, counter("c", late, 1), kvstore.ErrInvalidPeriod},
		"zero quota":        {kvstore.OpTake, counter("c", &noQuota, 1), kvstore.ErrInvalidPeriod},
		"quota past 2^52":   {kvstore.OpTake, counter("c", &bigQuota, 1), kvstore.ErrInvalidPeriod},
		"with a refill":     {kvstore.OpTake, kvstore.Update{Key: "c", Period: good, Refill: slow, N: 1}, kvstore.ErrInvalidPeriod},
		"n above the quota": {kvstore.OpTake, counter("c", good, 6), kvstore.ErrInvalidOp},
		"zero n":            {kvstore.OpPeek, counter("c", good, 0), kvstore.ErrInvalidOp},
		"zero refund":       {kvstore.OpRefund, counter("c", good, 0), kvstore.ErrInvalidOp},
		"unknown op":        {0, counter("c", good, 1), kvstore.ErrInvalidOp},
	} {
		u := []kvstore.Update{{Key: "b", Refill: slow, N: unit}, tc.u}
		if err := s.UpdateMulti(ctx(t), g, tc.op, u, make([]kvstore.OpResult, 2)); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", name, err, tc.want)
		}
	}
	if err := kvstore.CheckMulti(kvstore.OpTake, []kvstore.Update{counter("c", good, 1)}, make([]kvstore.OpResult, 1)); !errors.Is(err, kvstore.ErrInvalidPeriod) {
		t.Errorf("CheckMulti of a period counter: err = %v, want ErrInvalidPeriod", err)
	}
	res := multi(t, s, g, kvstore.OpPeek, kvstore.Update{Key: "b", Refill: slow, N: unit}, counter("c", good, 1))
	if res[0].Remaining != 10*unit || res[1].Used != 0 {
		t.Errorf("after refused calls: %+v; want both untouched", res)
	}
}

// testPeriodConcurrent runs 64 workers that each try 10 takes of one unit
// from a counter of quota 100 and a bucket of 1,000 tokens, in one call:
// exactly 100 succeed, and the counter reads 100 afterwards.
func testPeriodConcurrent(t *testing.T, s kvstore.PeriodCounter) {
	const workers, perWorker, quota = 64, 10, 100
	g := group(s)
	p := centred(quota)
	big := kvstore.Refill{Burst: 1000 * unit, Rate: 1}
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var (
		admitted atomic.Int64
		errs     atomic.Int64
		wg       sync.WaitGroup
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWorker; i++ {
				u := []kvstore.Update{{Key: "b", Refill: big, N: unit}, counter("c", p, 1)}
				res := make([]kvstore.OpResult, 2)
				if err := s.UpdateMulti(c, g, kvstore.OpTake, u, res); err != nil {
					errs.Add(1)
				} else if res[0].OK && res[1].OK {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := errs.Load(); n > 0 {
		t.Fatalf("%d calls failed", n)
	}
	if n := admitted.Load(); n != quota {
		t.Fatalf("%d takes admitted, want exactly %d", n, quota)
	}
	res := multi(t, s, g, kvstore.OpPeek, kvstore.Update{Key: "b", Refill: big, N: unit}, counter("c", p, 1))
	if res[1].Used != quota || res[1].OK {
		t.Fatalf("counter after the race = %+v; want %d used", res[1], quota)
	}
	if got := res[0].Remaining / unit; got != 1000-quota {
		t.Fatalf("bucket after the race at %d tokens, want %d", got, 1000-quota)
	}
}
