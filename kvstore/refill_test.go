package kvstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ratekit/ratekit/kvstore"
)

func TestRefillApply(t *testing.T) {
	r := kvstore.Refill{Burst: 1000, Rate: 3}
	const now = 1_000_000
	at := func(v, tm int64) kvstore.Record { return kvstore.Record{Value: v, Time: tm} }
	for _, tc := range []struct {
		name      string
		rec       kvstore.Record
		ok        bool
		op        kvstore.Op
		n         int64
		want      kvstore.OpResult
		wantNext  kvstore.Record
		wantWrite bool
	}{
		{"absent take", kvstore.Record{}, false, kvstore.OpTake, 10, kvstore.OpResult{OK: true, Remaining: 990}, at(990, now), true},
		{"absent peek", kvstore.Record{}, false, kvstore.OpPeek, 1000, kvstore.OpResult{OK: true, Remaining: 1000}, kvstore.Record{}, false},
		{"refill 100µs", at(0, now-100), true, kvstore.OpTake, 300, kvstore.OpResult{OK: true, Remaining: 0}, at(0, now), true},
		{"refill short by one unit", at(0, now-100), true, kvstore.OpTake, 301, kvstore.OpResult{Remaining: 300}, kvstore.Record{}, false},
		{"refill caps at max", at(999, now-100), true, kvstore.OpPeek, 1, kvstore.OpResult{OK: true, Remaining: 1000}, kvstore.Record{}, false},
		{"idle for years", at(0, 0), true, kvstore.OpTake, 1000, kvstore.OpResult{OK: true, Remaining: 0}, at(0, now), true},
		{"same microsecond", at(5, now), true, kvstore.OpTake, 5, kvstore.OpResult{OK: true, Remaining: 0}, at(0, now), true},
		{"clock stepped back", at(5, now+50), true, kvstore.OpTake, 5, kvstore.OpResult{OK: true, Remaining: 0}, at(0, now+50), true},
		{"clock stepped back, refused", at(5, now+50), true, kvstore.OpTake, 6, kvstore.OpResult{Remaining: 5}, kvstore.Record{}, false},
		{"negative stored value", at(-50, now), true, kvstore.OpPeek, 1, kvstore.OpResult{Remaining: 0}, kvstore.Record{}, false},
		{"value above max", at(5000, now), true, kvstore.OpPeek, 1000, kvstore.OpResult{OK: true, Remaining: 1000}, kvstore.Record{}, false},
		{"refund", at(10, now), true, kvstore.OpRefund, 5, kvstore.OpResult{OK: true, Remaining: 15}, at(15, now), true},
		{"refund caps", at(10, now), true, kvstore.OpRefund, 1 << 62, kvstore.OpResult{OK: true, Remaining: 1000}, at(1000, now), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, next, write, err := r.Apply(tc.rec, tc.ok, now, tc.op, tc.n)
			if err != nil {
				t.Fatal(err)
			}
			if res != tc.want || next != tc.wantNext || write != tc.wantWrite {
				t.Fatalf("Apply = %+v, %+v, %v; want %+v, %+v, %v", res, next, write, tc.want, tc.wantNext, tc.wantWrite)
			}
		})
	}
}

func TestRefillErrors(t *testing.T) {
	good := kvstore.Refill{Burst: 10, Rate: 1}
	for _, tc := range []struct {
		r    kvstore.Refill
		op   kvstore.Op
		n    int64
		want error
	}{
		{kvstore.Refill{Burst: 0, Rate: 1}, kvstore.OpTake, 1, kvstore.ErrInvalidRefill},
		{kvstore.Refill{Burst: kvstore.MaxValue + 1, Rate: 1}, kvstore.OpTake, 1, kvstore.ErrInvalidRefill},
		{kvstore.Refill{Burst: 10, Rate: 0}, kvstore.OpTake, 1, kvstore.ErrInvalidRefill},
		{kvstore.Refill{Burst: 10, Rate: 11}, kvstore.OpTake, 1, kvstore.ErrInvalidRefill},
		{good, kvstore.OpTake, 0, kvstore.ErrInvalidOp},
		{good, kvstore.OpTake, 11, kvstore.ErrInvalidOp},
		{good, kvstore.OpPeek, 11, kvstore.ErrInvalidOp},
		{good, kvstore.OpRefund, 0, kvstore.ErrInvalidOp},
		{good, kvstore.Op(0), 1, kvstore.ErrInvalidOp},
		{good, kvstore.Op(4), 1, kvstore.ErrInvalidOp},
	} {
		if _, _, _, err := tc.r.Apply(kvstore.Record{}, false, 0, tc.op, tc.n); !errors.Is(err, tc.want) {
			t.Errorf("Apply(%+v, op %d, n %d): %v, want %v", tc.r, tc.op, tc.n, err, tc.want)
		}
	}
}

func TestTimeUntil(t *testing.T) {
	r := kvstore.Refill{Burst: 1000, Rate: 3}
	for _, tc := range []struct {
		level, target int64
		want          time.Duration
	}{
		{1000, 1000, 0},
		{0, 1000, 334 * time.Microsecond}, // 333⅓µs, rounded up
		{999, 1000, time.Microsecond},
		{10, 13, time.Microsecond},
		{10, 14, 2 * time.Microsecond},
		{-5, 3, time.Microsecond},
	} {
		if got := r.TimeUntil(tc.level, tc.target); got != tc.want {
			t.Errorf("TimeUntil(%d, %d) = %v, want %v", tc.level, tc.target, got, tc.want)
		}
	}
	if got := (kvstore.Refill{Burst: kvstore.MaxValue, Rate: 1}).TimeToFull(0); got != kvstore.MaxValue*time.Microsecond {
		t.Errorf("TimeToFull at the largest max = %v (overflow?)", got)
	}
}

// FuzzApply checks Apply's invariants on arbitrary inputs: the level stays in
// [0, Burst], a take never creates units, a refused take and a peek write
// nothing, and the refill after a take equals elapsed × Rate (capped).
func FuzzApply(f *testing.F) {
	f.Add(int64(1000), int64(3), int64(500), int64(100), int64(200), uint8(1), int64(10))
	f.Add(int64(1), int64(1), int64(0), int64(0), int64(0), uint8(1), int64(1))
	f.Add(int64(kvstore.MaxValue), int64(7), int64(-1), int64(1<<62), int64(-1<<62), uint8(3), int64(1<<62))
	f.Fuzz(func(t *testing.T, maxv, rate, value, recTime, now int64, op uint8, n int64) {
		r := kvstore.Refill{Burst: maxv, Rate: rate}
		if r.Validate() != nil || r.CheckOp(kvstore.Op(op), n) != nil {
			return
		}
		// Keep times in the range a microsecond clock reaches (±280,000 years).
		if recTime > 1<<53 || recTime < -1<<53 || now > 1<<53 || now < -1<<53 {
			return
		}
		rec := kvstore.Record{Value: value, Time: recTime}
		res, next, write, err := r.Apply(rec, true, now, kvstore.Op(op), n)
		if err != nil {
			t.Fatal(err)
		}
		if res.Remaining < 0 || res.Remaining > maxv {
			t.Fatalf("level %d outside [0, %d]", res.Remaining, maxv)
		}
		level, _ := r.Level(rec, true, now)
		switch kvstore.Op(op) {
		case kvstore.OpTake:
			if res.OK != (level >= n) || (res.OK && res.Remaining != level-n) || (!res.OK && (write || res.Remaining != level)) {
				t.Fatalf("take %d from %d: %+v write %v", n, level, res, write)
			}
		case kvstore.OpPeek:
			if write || res.Remaining != level || res.OK != (level >= n) {
				t.Fatalf("peek %d at %d: %+v write %v", n, level, res, write)
			}
		case kvstore.OpRefund:
			if !write || res.Remaining != min(maxv, level+min(n, maxv)) {
				t.Fatalf("refund %d to %d: %+v", n, level, res)
			}
		}
		if write && (next.Value != res.Remaining || next.Time < now && next.Time != recTime) {
			t.Fatalf("next record %+v for result %+v at %d", next, res, now)
		}
		// Refill is exact: the level after elapsed µs is the clamped start
		// plus elapsed × rate, capped at max.
		start := min(max(value, 0), maxv)
		if now > recTime {
			elapsed := now - recTime
			want := maxv
			if elapsed < (maxv-start+rate-1)/rate {
				want = start + elapsed*rate
			}
			if level != want {
				t.Fatalf("refill from %d over %dµs at %d/µs = %d, want %d", start, elapsed, rate, level, want)
			}
		} else if level != start {
			t.Fatalf("level %d with no elapsed time, want %d", level, start)
		}
	})
}
