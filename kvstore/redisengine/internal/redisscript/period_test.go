package redisscript

import (
	"slices"
	"testing"

	"github.com/ratekit/ratekit/kvstore"
)

// TestParsePeriodReply: MultiPeriod's two reply forms. The full form
// carries the clock and each counter's period; the short form of a T take
// done on its first pass carries each counter's PTTL, which places Redis's
// clock, in whole milliseconds, in period 2, or in period 1 before b1.
// Anything else is not a reply.
func TestParsePeriodReply(t *testing.T) {
	// Periods of an hour, whose bounds are not whole milliseconds.
	const hour = 3_600_000_000
	b := [4]int64{1_000_000_000_500, 1_000_000_000_500 + hour, 1_000_000_000_500 + 2*hour, 1_000_000_000_500 + 3*hour}
	expiry := (b[2]+999)/1000 + 60_000 // ms
	ups := []kvstore.Update{
		{Key: "a", Refill: kvstore.Refill{Burst: 10, Rate: 1}, N: 1},
		{Key: "m", N: 2, Period: &kvstore.PeriodBounds{Bounds: b, Quota: 5}},
	}
	ttlAt := func(us int64) int64 { return expiry - us/1000 } // PTTL at a whole millisecond us
	for _, c := range []struct {
		name string
		vals []int64
		ok   bool
		want [2]kvstore.OpResult
	}{
		{"full, taken", []int64{b[1] + 7000, 9, 3, 2}, true, [2]kvstore.OpResult{{OK: true, Remaining: 9}, {OK: true, Used: 3, Remaining: 2, Now: b[1] + 7000, Period: 2}}},
		{"full, refused in period 3", []int64{b[2] + 7000, -1, 5, -3}, true, [2]kvstore.OpResult{{OK: false, Remaining: 0}, {OK: false, Used: 5, Remaining: 0, Now: b[2] + 7000, Period: 3}}},
		{"full, a bad period", []int64{b[1], 9, 3, 4}, false, [2]kvstore.OpResult{}},
		{"full, a negative count", []int64{b[1], 9, -3, 2}, false, [2]kvstore.OpResult{}},
		{"short, period 2", []int64{9, 3, ttlAt(b[1] + 10_500_000)}, true, [2]kvstore.OpResult{{OK: true, Remaining: 9}, {OK: true, Used: 3, Remaining: 2, Now: b[1] + 10_499_500, Period: 2}}},
		{"short, the last millisecond of period 2", []int64{9, 3, 60_001}, true, [2]kvstore.OpResult{{OK: true, Remaining: 9}, {OK: true, Used: 3, Remaining: 2, Now: (expiry - 60_001) * 1000, Period: 2}}},
		{"short, period 1 (a record of a later period)", []int64{9, 5, ttlAt(b[0] + 1_000_500)}, true, [2]kvstore.OpResult{{OK: true, Remaining: 9}, {OK: true, Used: 5, Remaining: 0, Now: b[0] + 1_000_500, Period: 1}}},
		{"short, the first millisecond at or after b0", []int64{9, 3, expiry - (b[0]+999)/1000}, true, [2]kvstore.OpResult{{OK: true, Remaining: 9}, {OK: true, Used: 3, Remaining: 2, Now: (b[0] + 999) / 1000 * 1000, Period: 1}}},
		{"short, a clock before b0", []int64{9, 3, expiry - (b[0]+999)/1000 + 1}, false, [2]kvstore.OpResult{}},
		{"short, a clock at b2", []int64{9, 3, 60_000}, false, [2]kvstore.OpResult{}},
		{"short, a count above the quota", []int64{9, 6, ttlAt(b[1] + 1000)}, false, [2]kvstore.OpResult{}},
		{"short, a count of zero", []int64{9, 0, ttlAt(b[1] + 1000)}, false, [2]kvstore.OpResult{}},
		{"short, a refused bucket", []int64{-1, 3, ttlAt(b[1] + 1000)}, false, [2]kvstore.OpResult{}},
		{"too short", []int64{9, 3}, false, [2]kvstore.OpResult{}},
		{"too long", []int64{b[1], 9, 3, 2, 0}, false, [2]kvstore.OpResult{}},
	} {
		res := make([]kvstore.OpResult, 2)
		ok := ParsePeriodReply(c.vals, ups, res)
		if ok != c.ok {
			t.Errorf("%s: ok = %v, want %v", c.name, ok, c.ok)
			continue
		}
		if ok && [2]kvstore.OpResult(res) != c.want {
			t.Errorf("%s: results %+v, want %+v", c.name, res, c.want)
		}
	}
}

// TestPeriodArgs: a counter's arguments name the field of the period the
// client's clock is in and the span, the largest PTTL its record has
// while Redis's clock is at or after b0.
func TestPeriodArgs(t *testing.T) {
	var text Text
	ups := []kvstore.Update{
		{Key: "m", N: 2, Period: &kvstore.PeriodBounds{Bounds: [4]int64{1500, 2_000_000, 3_000_001, 4_000_000}, Quota: 500}},
		{Key: "a", Refill: kvstore.Refill{Burst: 10, Rate: 1}, N: 1},
	}
	got := PeriodArgs(nil, &text, "T", ups)
	want := []string{"T", "p", "1500", "2000000 3000001", "4000000", "62999", "500", "2", "b", "10", "10", "1"}
	if !slices.Equal(got, want) {
		t.Fatalf("args %q, want %q", got, want)
	}
}

// FuzzParsePeriodReply checks that ParsePeriodReply never panics on any
// reply, and that what it accepts is a result the script could give: a
// counter's Used within what its count can be, its period from 1 to 3,
// its clock in the period picked, and a short reply's takes all admitted.
func FuzzParsePeriodReply(f *testing.F) {
	f.Add(int64(1_000_000_000_500), int64(150), int64(9), int64(3), int64(2), int64(0), uint8(4))
	f.Add(int64(1_000_000_000_500), int64(3_600_000), int64(9), int64(3), int64(3_660_001), int64(0), uint8(3))
	f.Add(int64(0), int64(1), int64(-1), int64(0), int64(60_001), int64(5), uint8(5))
	f.Fuzz(func(t *testing.T, b0, width, v0, v1, v2, v3 int64, n uint8) {
		if width < 1 || b0 < 0 || b0 > kvstore.MaxPeriodBound-3*width || width > kvstore.MaxPeriodBound/3 {
			return
		}
		p := &kvstore.PeriodBounds{Bounds: [4]int64{b0, b0 + width, b0 + 2*width, b0 + 3*width}, Quota: 5}
		ups := []kvstore.Update{
			{Key: "a", Refill: kvstore.Refill{Burst: 10, Rate: 1}, N: 1},
			{Key: "m", N: 2, Period: p},
		}
		vals := []int64{v0, v1, v2, v3}[:min(int(n), 4)]
		res := make([]kvstore.OpResult, 2)
		if !ParsePeriodReply(vals, ups, res) {
			return
		}
		r := res[1]
		if r.Period < 1 || r.Period > 3 || r.Used < 0 || r.Remaining != max(p.Quota-r.Used, 0) {
			t.Fatalf("reply %v: counter result %+v", vals, r)
		}
		if len(vals) == 3 {
			if !res[0].OK || !r.OK || r.Used > p.Quota || r.Now%1000 != 0 || r.Now < p.Bounds[0] || r.Now >= p.Bounds[2] || (r.Period == 1) != (r.Now < p.Bounds[1]) {
				t.Fatalf("short reply %v: results %+v", vals, res)
			}
		}
	})
}
