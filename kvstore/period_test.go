package kvstore_test

import (
	"errors"
	"testing"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
)

func TestPeriodApply(t *testing.T) {
	p := kvstore.PeriodBounds{Bounds: [4]int64{100, 200, 300, 400}, Quota: 10}
	rec := func(v, start int64) kvstore.Record { return kvstore.Record{Value: v, Time: start} }
	for _, tc := range []struct {
		name      string
		rec       kvstore.Record
		ok        bool
		now       int64
		op        kvstore.Op
		n         int64
		want      kvstore.OpResult
		wantNext  kvstore.Record
		wantWrite bool
	}{
		{"absent take", rec(0, 0), false, 250, kvstore.OpTake, 4, kvstore.OpResult{OK: true, Remaining: 6, Used: 4, Now: 250, Period: 2}, rec(4, 200), true},
		{"same period", rec(4, 200), true, 299, kvstore.OpTake, 6, kvstore.OpResult{OK: true, Remaining: 0, Used: 10, Now: 299, Period: 2}, rec(10, 200), true},
		{"refused", rec(4, 200), true, 200, kvstore.OpTake, 7, kvstore.OpResult{Remaining: 6, Used: 4, Now: 200, Period: 2}, rec(4, 200), false},
		{"earlier period counts zero", rec(9, 200), true, 300, kvstore.OpTake, 10, kvstore.OpResult{OK: true, Remaining: 0, Used: 10, Now: 300, Period: 3}, rec(10, 300), true},
		{"later period keeps its count", rec(9, 250), true, 150, kvstore.OpPeek, 2, kvstore.OpResult{Remaining: 1, Used: 9, Now: 150, Period: 1}, rec(9, 250), false},
		{"over the quota", rec(15, 200), true, 250, kvstore.OpPeek, 1, kvstore.OpResult{Remaining: 0, Used: 15, Now: 250, Period: 2}, rec(15, 200), false},
		{"refund", rec(15, 200), true, 250, kvstore.OpRefund, 7, kvstore.OpResult{OK: true, Remaining: 2, Used: 8, Now: 250, Period: 2}, rec(8, 200), true},
		{"refund below zero", rec(3, 200), true, 250, kvstore.OpRefund, 7, kvstore.OpResult{OK: true, Remaining: 10, Used: 0, Now: 250, Period: 2}, rec(0, 200), true},
		{"refund to an ended period", rec(3, 100), true, 250, kvstore.OpRefund, 1, kvstore.OpResult{OK: true, Remaining: 10, Used: 0, Now: 250, Period: 2}, rec(0, 200), false},
	} {
		res, next, write, err := p.Apply(tc.rec, tc.ok, tc.now, tc.op, tc.n)
		if err != nil || res != tc.want || next != tc.wantNext || write != tc.wantWrite {
			t.Errorf("%s: Apply = %+v, %+v, %v, %v; want %+v, %+v, %v", tc.name, res, next, write, err, tc.want, tc.wantNext, tc.wantWrite)
		}
	}
	for _, now := range []int64{99, 400, -1} {
		if _, _, _, err := p.Apply(kvstore.Record{}, false, now, kvstore.OpPeek, 1); !errors.Is(err, ratekit.ErrClockSkew) {
			t.Errorf("now %d: err = %v, want ErrClockSkew", now, err)
		}
	}
}

// FuzzPeriodApply checks the invariants of PeriodBounds.Apply for any
// bounds, record, clock and op: no panic; an error for invalid arguments
// and for a clock outside the bounds, and otherwise a result whose count
// is never negative, whose remaining is in [0, Quota], and which takes
// only what fits.
func FuzzPeriodApply(f *testing.F) {
	f.Add(int64(0), int64(10), int64(20), int64(30), int64(5), int64(3), int64(10), true, int64(15), uint8(1), int64(2))
	f.Add(int64(100), int64(200), int64(300), int64(400), int64(1), int64(9), int64(250), true, int64(150), uint8(3), int64(1<<62))
	f.Fuzz(func(t *testing.T, b0, b1, b2, b3, quota, used, start int64, ok bool, now int64, op uint8, n int64) {
		p := kvstore.PeriodBounds{Bounds: [4]int64{b0, b1, b2, b3}, Quota: quota}
		res, next, write, err := p.Apply(kvstore.Record{Value: used, Time: start}, ok, now, kvstore.Op(op), n)
		if err != nil {
			if p.Validate() == nil && p.CheckOp(kvstore.Op(op), n) == nil && p.Pick(now) != 0 {
				t.Fatalf("Apply failed on valid arguments: %v", err)
			}
			return
		}
		if res.Used < 0 || res.Remaining < 0 || res.Remaining > quota || res.Remaining != max(quota-res.Used, 0) {
			t.Fatalf("result %+v out of range for quota %d", res, quota)
		}
		if res.Period < 1 || res.Period > 3 || now < p.Bounds[res.Period-1] || now >= p.Bounds[res.Period] || res.Now != now {
			t.Fatalf("period %d, now %d for bounds %v", res.Period, res.Now, p.Bounds)
		}
		if write && (next.Value != res.Used || next.Time < p.Bounds[res.Period-1]) {
			t.Fatalf("writes %+v for result %+v", next, res)
		}
		if kvstore.Op(op) == kvstore.OpTake && res.OK && res.Used > quota {
			t.Fatalf("a take admitted past the quota: %+v", res)
		}
	})
}
