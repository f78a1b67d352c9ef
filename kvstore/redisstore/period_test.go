package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
)

// hourAround returns period bounds, in µs, whose middle period is the hour
// around now.
func hourAround(quota int64) *kvstore.PeriodBounds {
	now := time.Now()
	p := &kvstore.PeriodBounds{Quota: quota}
	for i, o := range []time.Duration{-90 * time.Minute, -30 * time.Minute, 30 * time.Minute, 90 * time.Minute} {
		p.Bounds[i] = now.Add(o).UnixMicro()
	}
	return p
}

// field is the field of a period counter's record for [start, end).
func field(start, end int64) string {
	return strconv.FormatInt(start, 10) + " " + strconv.FormatInt(end, 10)
}

// expiryOf returns the expiry of the record of a period that ends at end
// (µs): a minute after the end, in whole milliseconds.
func expiryOf(end int64) time.Duration {
	return time.Duration((end+999)/1000+60_000) * time.Millisecond
}

// checkRecord fails t unless key holds the record of the period [start,
// end) with count: a hash of one field, "<start> <end>", expiring a minute
// after end.
func checkRecord(t *testing.T, c *redis.Client, key string, start, end, count int64) {
	t.Helper()
	ctx := context.Background()
	h, err := c.HGetAll(ctx, key).Result()
	if want := map[string]string{field(start, end): strconv.FormatInt(count, 10)}; err != nil || len(h) != 1 || h[field(start, end)] != want[field(start, end)] {
		t.Fatalf("record %v (%v), want %v", h, err, want)
	}
	if got := c.PExpireTime(ctx, key).Val(); got != expiryOf(end) {
		t.Fatalf("expiry %v, want %v (the period's end plus a minute)", got, expiryOf(end))
	}
}

// TestPeriodRecord: a counter's record is a hash of one field, "<period
// start> <period end>", holding the count, expiring a minute after the
// period's end; a bucket's record where a counter is asked for, the
// reverse, and anything else fail the call with ErrMalformedRecord and
// change nothing.
func TestPeriodRecord(t *testing.T) {
	s, c := newStore(t)
	ctx := context.Background()
	p := hourAround(10)
	b := p.Bounds
	res := make([]kvstore.OpResult, 2)
	// A bucket whose key lives a second after a take, so that it is still
	// there, as a bucket's record, when a counter is asked for on it.
	slow := kvstore.Refill{Burst: 1_000_000, Rate: 1}
	u := []kvstore.Update{{Key: "a", Refill: slow, N: 1}, {Key: "c", Period: p, N: 3}}
	for i, want := range []int64{3, 6} { // the record's first take, then one on its first pass
		if err := s.UpdateMulti(ctx, "", kvstore.OpTake, u, res); err != nil || !res[1].OK || res[1].Used != want || res[1].Period != 2 {
			t.Fatalf("take %d: %+v, %v", i, res, err)
		}
		checkRecord(t, c, s.Key("c"), b[1], b[2], want)
		if res[1].Now < b[1] || res[1].Now >= b[2] || res[1].Now%1000 != 0 {
			t.Fatalf("take %d: Now %d is not a millisecond of the period picked", i, res[1].Now)
		}
	}
	for k, v := range map[string]func() error{
		"x": func() error { return c.Set(ctx, s.Key("x"), "1 2 3", 0).Err() },
		"two fields": func() error {
			return c.HSet(ctx, s.Key("two fields"), field(b[1], b[2]), 1, field(b[0], b[1]), 1).Err()
		},
		"a fraction":  func() error { return c.HSet(ctx, s.Key("a fraction"), field(b[1], b[2]), "1.5").Err() },
		"a bad field": func() error { return c.HSet(ctx, s.Key("a bad field"), strconv.FormatInt(b[1], 10), 1).Err() },
		"a negative count": func() error {
			return c.HSet(ctx, s.Key("a negative count"), field(b[0], b[1]), -4).Err()
		},
		"an end before the start": func() error { return c.HSet(ctx, s.Key("an end before the start"), field(b[2], b[1]), 1).Err() },
		"no expiry":               func() error { return c.Set(ctx, s.Key("no expiry"), "1 "+strconv.FormatInt(b[1], 10), 0).Err() },
	} {
		if err := v(); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
	}
	cases := map[string][]kvstore.Update{
		"counter on a bucket": {{Key: "c", Period: p, N: 1}, {Key: "a", Period: p, N: 1}},
		"bucket on a counter": {{Key: "c", Refill: redistest.Take1, N: 1}},
		"counter on garbage":  {{Key: "c", Period: p, N: 1}, {Key: "x", Period: p, N: 1}},
	}
	for _, k := range []string{"two fields", "a fraction", "a bad field", "a negative count", "an end before the start", "no expiry"} {
		cases["counter on "+k] = []kvstore.Update{{Key: "c", Period: p, N: 1}, {Key: k, Period: p, N: 1}}
	}
	before := map[string]map[string]string{}
	for _, k := range []string{"two fields", "a fraction", "a bad field", "a negative count", "an end before the start"} {
		before[k] = c.HGetAll(ctx, s.Key(k)).Val()
	}
	for name, u := range cases {
		for _, op := range []kvstore.Op{kvstore.OpTake, kvstore.OpPeek, kvstore.OpRefund} {
			if err := s.UpdateMulti(ctx, "", op, u, make([]kvstore.OpResult, len(u))); !errors.Is(err, kvstore.ErrMalformedRecord) {
				t.Errorf("%s, op %d: err = %v, want ErrMalformedRecord", name, op, err)
			}
		}
	}
	checkRecord(t, c, s.Key("c"), b[1], b[2], 6)
	for k, h := range before {
		if got := c.HGetAll(ctx, s.Key(k)).Val(); len(got) != len(h) || fmt.Sprint(got) != fmt.Sprint(h) {
			t.Errorf("%s: after refused calls the hash is %v, was %v", k, got, h)
		}
	}
	// A refund to zero deletes the record.
	u[1].N = 6
	if err := s.UpdateMulti(ctx, "", kvstore.OpRefund, u[1:], res[1:]); err != nil || res[1].Used != 0 {
		t.Fatalf("refund: %+v, %v", res[1], err)
	}
	if n := c.Exists(ctx, s.Key("c")).Val(); n != 0 {
		t.Fatal("a counter refunded to zero left its record")
	}
}

// TestPeriodRecordOfAnotherPeriod: what a record counts in the period
// Redis's clock picks, and how a take rewrites it: a record of an earlier
// period counts zero; one that started later keeps its count, rewritten to
// expire after the later of the two ends; an older release's record,
// "<count> <start>" in a string, counts by the same rules and becomes a
// hash. A take on the record of the client's period, done on the script's
// first pass, places Redis's clock from the record's expiry: before b1 it
// counts in period 1, and before b0 it fails with ErrClockSkew and changes
// nothing. A first take that finds another period's record leaves one
// field.
func TestPeriodRecordOfAnotherPeriod(t *testing.T) {
	s, c := newStore(t)
	ctx := context.Background()
	p := hourAround(100)
	b := p.Bounds
	const hour = int64(time.Hour / time.Microsecond)
	take := func(key string, p *kvstore.PeriodBounds) (kvstore.OpResult, error) {
		res := make([]kvstore.OpResult, 1)
		err := s.UpdateMulti(ctx, "", kvstore.OpTake, []kvstore.Update{{Key: key, Period: p, N: 1}}, res)
		return res[0], err
	}
	put := func(key string, start, end, count int64) {
		t.Helper()
		if _, err := c.TxPipelined(ctx, func(tx redis.Pipeliner) error {
			tx.Del(ctx, s.Key(key))
			tx.HSet(ctx, s.Key(key), field(start, end), count)
			tx.PExpireAt(ctx, s.Key(key), time.UnixMilli(0).Add(expiryOf(end)))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	putOld := func(key string, start, end, count int64) {
		t.Helper()
		if err := c.Set(ctx, s.Key(key), strconv.FormatInt(count, 10)+" "+strconv.FormatInt(start, 10), 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.PExpireAt(ctx, s.Key(key), time.UnixMilli(0).Add(expiryOf(end))).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, c2 := range []struct {
		name             string
		set              func(key string)
		used             int64
		start, end, kept int64
	}{
		{"an earlier period's record", func(k string) { put(k, b[0], b[1], 40) }, 1, b[1], b[2], 1},
		{"a later start, a later end", func(k string) { put(k, b[1]+hour/2, b[2]+hour/2, 40) }, 41, b[1] + hour/2, b[2] + hour/2, 41},
		{"a later start, an earlier end", func(k string) { put(k, b[1]+hour/4, b[2]-hour/4, 40) }, 41, b[1] + hour/4, b[2], 41},
		{"the same start, an earlier end", func(k string) { put(k, b[1], b[1]+hour/2, 40) }, 41, b[1], b[2], 41},
		{"an older release's record of the period", func(k string) { putOld(k, b[1], b[2], 40) }, 41, b[1], b[2], 41},
		{"an older release's record of an earlier period", func(k string) { putOld(k, b[0], b[1], 40) }, 1, b[1], b[2], 1},
		// An older release's record gives its end to the millisecond:
		// the earliest end its expiry allows.
		{"an older release's record of a later start", func(k string) { putOld(k, b[1]+hour/2, b[2]+hour/2, 40) }, 41, b[1] + hour/2, (b[2]+hour/2+999)/1000*1000 - 999, 41},
	} {
		c2.set(c2.name)
		r, err := take(c2.name, p)
		if err != nil || !r.OK || r.Used != c2.used || r.Period != 2 || r.Remaining != 100-c2.used {
			t.Errorf("%s: %+v, %v; want Used %d in period 2", c2.name, r, err, c2.used)
			continue
		}
		checkRecord(t, c, s.Key(c2.name), c2.start, c2.end, c2.kept)
		// The next take counts on.
		if r, err := take(c2.name, p); err != nil || r.Used != c2.used+1 || r.Period != 2 {
			t.Errorf("%s, the next take: %+v, %v", c2.name, r, err)
		}
	}

	// The record of the client's period [b1, b2) while Redis's clock is in
	// [b0, b1): a record of a later period, which keeps its count, in
	// period 1.
	early := &kvstore.PeriodBounds{Quota: 100, Bounds: [4]int64{b[1] - hour, b[2], b[2] + hour, b[2] + 2*hour}}
	put("early", b[2], b[2]+hour, 7)
	if r, err := take("early", early); err != nil || !r.OK || r.Used != 8 || r.Period != 1 || r.Now < b[1] || r.Now >= b[2] {
		t.Errorf("a later period's record, Redis's clock in period 1: %+v, %v", r, err)
	}
	checkRecord(t, c, s.Key("early"), b[2], b[2]+hour, 8)
	// Redis's clock before b0: ErrClockSkew, and the record stays.
	skewed := &kvstore.PeriodBounds{Quota: 100, Bounds: [4]int64{b[2], b[2] + hour, b[2] + 2*hour, b[2] + 3*hour}}
	put("skewed", b[2]+hour, b[2]+2*hour, 7)
	if _, err := take("skewed", skewed); !errors.Is(err, ratekit.ErrClockSkew) {
		t.Errorf("Redis's clock before b0: %v, want ErrClockSkew", err)
	}
	checkRecord(t, c, s.Key("skewed"), b[2]+hour, b[2]+2*hour, 7)
	// A take refused on the quota leaves the record as it was.
	put("full", b[1], b[2], 100)
	if r, err := take("full", p); err != nil || r.OK || r.Used != 100 {
		t.Errorf("a full counter: %+v, %v", r, err)
	}
	checkRecord(t, c, s.Key("full"), b[1], b[2], 100)
}

// TestPeriodFlushedScriptAndBucketsAlone: a call with counters recovers
// from SCRIPT FLUSH through EVAL, and a call of buckets alone runs the
// bucket script, which reads no clock. A take with a counter reads TIME
// on a counter's first take in a period, and not on the takes that follow
// (the record's expiry places the clock).
func TestPeriodFlushedScriptAndBucketsAlone(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	s, _ := redisstore.New(c, redisstore.Config{})
	ctx := context.Background()
	// A bucket that fills in a second, so that its key lives through the
	// calls and each take can be done on the script's first pass.
	slow := kvstore.Refill{Burst: 1_000_000, Rate: 1}
	u := []kvstore.Update{{Key: "a", Refill: slow, N: 1}, {Key: "c", Period: hourAround(5), N: 1}}
	res := make([]kvstore.OpResult, 2)
	for i := 0; i < 3; i++ {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := s.UpdateMulti(ctx, "", kvstore.OpPeek, u, res); err != nil {
			t.Fatalf("UpdateMulti after SCRIPT FLUSH: %v", err)
		}
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if err := s.UpdateMulti(ctx, "", kvstore.OpTake, u[:1], res[:1]); err != nil {
			t.Fatal(err)
		}
	}
	if info := c.Info(ctx, "commandstats").Val(); strings.Contains(info, "cmdstat_time:") {
		t.Fatalf("calls of buckets alone called TIME:\n%s", info)
	}
	for i := 0; i < 5; i++ {
		if err := s.UpdateMulti(ctx, "", kvstore.OpTake, u, res); err != nil || !res[1].OK || res[1].Used != int64(i+1) {
			t.Fatalf("take %d: %+v, %v", i, res, err)
		}
	}
	if info := c.Info(ctx, "commandstats").Val(); !strings.Contains(info, "cmdstat_time:calls=1,") {
		t.Fatalf("5 takes with a counter did not call TIME once, for the first:\n%s", info)
	}
}
