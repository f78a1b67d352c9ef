//go:build !js

package redistest

import (
	"context"
	"time"

	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisengine"
)

// Scripts returns the Lua text of the Redis engine's update script and of
// its multi-key script, as the engine hands them to its connection, for
// tests and measurements that run them with arguments of their own.
func Scripts() (update, multi string) {
	var r recorder
	e, err := redisengine.New(&r, redisengine.Config{Name: "redistest", Module: "github.com/ratekit/ratekit", Protocol: 1, Prefix: "p:"})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	refill := kvstore.Refill{Burst: 10, Rate: 1}
	if _, err := e.Update(ctx, "k", refill, kvstore.OpTake, 1); err != nil {
		panic(err)
	}
	update = r.src
	ups := []kvstore.Update{{Key: "a", Refill: refill, N: 1}, {Key: "b", Refill: refill, N: 1}}
	if err := e.UpdateMulti(ctx, "", kvstore.OpTake, ups, make([]kvstore.OpResult, len(ups))); err != nil {
		panic(err)
	}
	return update, r.src
}

// PeriodScript returns the Lua text of the Redis engine's period script
// (the multi-key script with period counters), as the engine hands it to
// its connection.
func PeriodScript() string {
	var r recorder
	e, err := redisengine.New(&r, redisengine.Config{Name: "redistest", Module: "github.com/ratekit/ratekit", Protocol: 1, Prefix: "p:"})
	if err != nil {
		panic(err)
	}
	ups := []kvstore.Update{{Key: "c", N: 1, Period: &kvstore.PeriodBounds{Bounds: [4]int64{0, 1, 2, 3}, Quota: 1}}}
	// The recorder's reply is not a period counter's, so the call fails
	// after the script was handed over: only its text matters here.
	e.UpdateMulti(context.Background(), "", kvstore.OpTake, ups, make([]kvstore.OpResult, 1))
	return r.src
}

// RateArg returns the rate argument of the update scripts for r: its
// refill in units per millisecond, capped at r.Max.
func RateArg(r kvstore.Refill) int64 {
	if r.Rate > r.Burst/1000 {
		return r.Burst
	}
	return r.Rate * 1000
}

// recorder is a redisengine.Conn that keeps the source of the last script
// it was asked to run and answers every key with a level of 0.
type recorder struct{ src string }

func (r *recorder) Eval(_ context.Context, s *redisengine.Script, keys, _ []string, dst []int64) ([]int64, error) {
	r.src = s.Source()
	for range keys {
		dst = append(dst, 0)
	}
	return dst, nil
}

func (r *recorder) Read(context.Context, []string, []int64, []string) (bool, error) {
	return false, nil
}

func (r *recorder) Get(context.Context, string) (string, bool, error) { return "", false, nil }

func (r *recorder) Set(context.Context, string, string, time.Duration) error { return nil }

func (r *recorder) Del(context.Context, string) error { return nil }

func (r *recorder) Partitioned() bool { return false }
