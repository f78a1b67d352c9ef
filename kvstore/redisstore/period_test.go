package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// TestPeriodRecord: a counter's record is "<count> <period start>" under
// one key, expiring a minute after its period's end; a bucket's record
// where a counter is asked for, the reverse, and anything else fail the
// call with ErrMalformedRecord and change nothing.
func TestPeriodRecord(t *testing.T) {
	s, c := newStore(t)
	ctx := context.Background()
	p := hourAround(10)
	res := make([]kvstore.OpResult, 2)
	// A bucket whose key lives a second after a take, so that it is still
	// there, as a bucket's record, when a counter is asked for on it.
	slow := kvstore.Refill{Burst: 1_000_000, Rate: 1}
	u := []kvstore.Update{{Key: "a", Refill: slow, N: 1}, {Key: "c", Period: p, N: 3}}
	if err := s.UpdateMulti(ctx, "", kvstore.OpTake, u, res); err != nil || !res[1].OK || res[1].Used != 3 || res[1].Period != 2 {
		t.Fatalf("take: %+v, %v", res, err)
	}
	if got, want := c.Get(ctx, s.Key("c")).Val(), "3 "+strconv.FormatInt(p.Bounds[1], 10); got != want {
		t.Fatalf("record %q, want %q", got, want)
	}
	end := (p.Bounds[2]+999)/1000 + 60_000
	if got := c.PExpireTime(ctx, s.Key("c")).Val(); got != time.Duration(end)*time.Millisecond {
		t.Fatalf("expiry %v, want %v (the period's end plus a minute)", got, time.Duration(end)*time.Millisecond)
	}
	if res[1].Now < p.Bounds[1] || res[1].Now >= p.Bounds[2] {
		t.Fatalf("Now %d outside the period picked", res[1].Now)
	}
	if err := c.Set(ctx, s.Key("x"), "1 2 3", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for name, u := range map[string][]kvstore.Update{
		"counter on a bucket": {{Key: "c", Period: p, N: 1}, {Key: "a", Period: p, N: 1}},
		"bucket on a counter": {{Key: "c", Refill: redistest.Take1, N: 1}},
		"counter on garbage":  {{Key: "c", Period: p, N: 1}, {Key: "x", Period: p, N: 1}},
	} {
		if err := s.UpdateMulti(ctx, "", kvstore.OpTake, u, make([]kvstore.OpResult, len(u))); !errors.Is(err, kvstore.ErrMalformedRecord) {
			t.Errorf("%s: err = %v, want ErrMalformedRecord", name, err)
		}
	}
	if got := c.Get(ctx, s.Key("c")).Val(); got != "3 "+strconv.FormatInt(p.Bounds[1], 10) {
		t.Fatalf("after refused calls the record is %q", got)
	}
	// A refund to zero deletes the record.
	if err := s.UpdateMulti(ctx, "", kvstore.OpRefund, u[1:], res[1:]); err != nil || res[1].Used != 0 {
		t.Fatalf("refund: %+v, %v", res[1], err)
	}
	if n := c.Exists(ctx, s.Key("c")).Val(); n != 0 {
		t.Fatal("a counter refunded to zero left its record")
	}
}

// TestPeriodFlushedScriptAndBucketsAlone: a call with counters recovers
// from SCRIPT FLUSH through EVAL, and a call of buckets alone runs the
// bucket script, which reads no clock.
func TestPeriodFlushedScriptAndBucketsAlone(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	s, _ := redisstore.New(c, redisstore.Config{})
	ctx := context.Background()
	u := []kvstore.Update{{Key: "a", Refill: redistest.Take1, N: 1}, {Key: "c", Period: hourAround(5), N: 1}}
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
		if err := s.UpdateMulti(ctx, "", kvstore.OpTake, u, res); err != nil {
			t.Fatal(err)
		}
	}
	if info := c.Info(ctx, "commandstats").Val(); !strings.Contains(info, "cmdstat_time:calls=5,") {
		t.Fatalf("5 calls with a counter did not call TIME 5 times:\n%s", info)
	}
}
