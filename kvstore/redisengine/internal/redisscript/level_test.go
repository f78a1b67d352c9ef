package redisscript

import (
	"math/big"
	"regexp"
	"strconv"
	"testing"

	"github.com/ratekit/ratekit/kvstore"
)

func TestLevel(t *testing.T) {
	const max, rate = 1000, 10
	for _, c := range []struct {
		name  string
		ttl   int64
		reply string
		level int64
		ok    bool
	}{
		{"no key", -2, "", max, true},
		{"no key, whatever GET said", -2, "junk", max, true},
		{"expires within the millisecond", 0, "junk", max, true},
		{"no expiry", -1, "5", 0, false},
		{"other negative PTTL", -3, "5", 0, false},
		{"debt within bounds", 50, "100", max - 400, true},
		{"debt zero", 10, "100", max, true},
		{"refilled past full", 10, "150", max, true},
		{"debt one short of max", 100, "1", 1, true},
		{"debt exactly max", 100, "0", 0, true},
		{"debt beyond max", 101, "0", 0, true},
		{"huge PTTL", 1 << 62, "0", 0, true},
		{"largest PTTL, largest value", 1<<63 - 1, strconv.FormatInt(1<<53-1, 10), 0, true},
		{"value 2^53", 50, strconv.FormatInt(1<<53, 10), 0, false},
		{"negative value", 50, "-1", 0, false},
		{"not a number", 50, "abc", 0, false},
		{"empty", 50, "", 0, false},
		{"a period counter's record", 50, "3 1795327323488854", 0, false},
		{"float", 50, "1.5", 0, false},
		{"leading space", 50, " 1", 0, false},
		{"plus sign", 50, "+1", 0, false},
		{"leading zero", 50, "01", 0, false},
		{"minus zero", 50, "-0", 0, false},
		{"zero", 50, "0", max - 500, true},
		{"hex", 50, "0x10", 0, false},
		{"exponent", 50, "1e3", 0, false},
		{"nan", 50, "nan", 0, false},
		{"trailing space", 50, "1 ", 0, false},
		{"overflowing digits", 50, "99999999999999999999", 0, false},
	} {
		level, ok := Level(max, rate, c.ttl, c.reply)
		if ok != c.ok || (ok && level != c.level) {
			t.Errorf("%s: Level(%d, %d, %d, %q) = %d, %v; want %d, %v", c.name, max, rate, c.ttl, c.reply, level, ok, c.level, c.ok)
		}
	}
}

// FuzzLevel checks Level against the debt computed without bounds, for
// every refill the stores accept.
func FuzzLevel(f *testing.F) {
	f.Add(int64(1000), int64(10), int64(50), "100")
	f.Add(int64(kvstore.MaxValue), int64(kvstore.MaxValue), int64(1<<62), "0")
	f.Add(int64(1), int64(1), int64(-1), "x")
	f.Fuzz(func(t *testing.T, max, rate, ttl int64, reply string) {
		if max < 1 || max > kvstore.MaxValue || rate < 1 || rate > max {
			return
		}
		level, ok := Level(max, rate, ttl, reply)
		if ttl == -2 || ttl == 0 {
			if !ok || level != max {
				t.Fatalf("Level(%d, %d, %d, %q) = %d, %v; want a full bucket", max, rate, ttl, reply, level, ok)
			}
			return
		}
		// A record's value is written by strconv.FormatInt (or Lua's
		// string.format('%d')), and reads back only as it was written.
		value, err := strconv.ParseInt(reply, 10, 64)
		valid := ttl > 0 && err == nil && value >= 0 && value < 1<<53 && strconv.FormatInt(value, 10) == reply
		if ok != valid {
			t.Fatalf("Level(%d, %d, %d, %q) reports %v", max, rate, ttl, reply, ok)
		}
		if !ok {
			return
		}
		debt := new(big.Int).Mul(big.NewInt(ttl), big.NewInt(rate))
		debt.Sub(debt, big.NewInt(value))
		if debt.Sign() < 0 {
			debt.SetInt64(0)
		}
		if debt.Cmp(big.NewInt(max)) > 0 {
			debt.SetInt64(max)
		}
		if want := max - debt.Int64(); level != want {
			t.Fatalf("Level(%d, %d, %d, %q) = %d, want %d", max, rate, ttl, reply, level, want)
		}
	})
}

func TestDecided(t *testing.T) {
	updates := []kvstore.Update{{N: 5}, {N: 10}}
	for _, c := range []struct {
		name    string
		op      kvstore.Op
		levels  []int64
		decided bool
		ok      []bool
	}{
		{"a take that fits every bucket goes to the script", kvstore.OpTake, []int64{5, 10}, false, nil},
		{"a take refused by one bucket", kvstore.OpTake, []int64{5, 9}, true, []bool{true, false}},
		{"a take refused by both", kvstore.OpTake, []int64{0, 0}, true, []bool{false, false}},
		{"a peek that fits", kvstore.OpPeek, []int64{7, 10}, true, []bool{true, true}},
		{"a peek that does not", kvstore.OpPeek, []int64{4, 10}, true, []bool{false, true}},
		{"a refund goes to the script", kvstore.OpRefund, []int64{0, 0}, false, nil},
	} {
		results := make([]kvstore.OpResult, 2)
		if got := Decided(c.op, c.levels, updates, results); got != c.decided {
			t.Errorf("%s: Decided = %v", c.name, got)
			continue
		}
		for i, ok := range c.ok {
			if results[i] != (kvstore.OpResult{OK: ok, Remaining: c.levels[i]}) {
				t.Errorf("%s: result %d = %+v, want OK %v at level %d", c.name, i, results[i], ok, c.levels[i])
			}
		}
	}
}

// TestScriptsDefineNoFunction: the scripts are put together from fragments
// as text, because Redis's Lua makes a closure of every function definition
// each time a script runs, which the decrement-first take would feel.
func TestScriptsDefineNoFunction(t *testing.T) {
	function := regexp.MustCompile(`\bfunction\b`)
	for name, src := range map[string]string{"Update": Update, "Multi": Multi, "MultiPeriod": MultiPeriod} {
		if loc := function.FindStringIndex(src); loc != nil {
			t.Errorf("%s defines a Lua function at byte %d", name, loc[0])
		}
	}
}
