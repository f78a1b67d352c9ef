package ratekit_test

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// benchLimiter is a token bucket in memory that always admits.
func benchLimiter(b *testing.B) ratekit.Limiter {
	store, err := memstore.New(memstore.Config{MaxKeys: 1 << 16})
	if err != nil {
		b.Fatal(err)
	}
	l, err := tokenbucket.New(tokenbucket.Config{
		Name: "bench", Burst: 1 << 30, RefillRate: tokenbucket.PerSecond(1 << 20),
		Mode: tokenbucket.Atomic, Store: store,
	})
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// benchGuard runs Guard.Check in parallel, each goroutine on its own key.
func benchGuard(b *testing.B, cfg httplimit.GuardConfig) {
	cfg.OnError = httplimit.FailOpen
	g, err := httplimit.NewGuard(cfg)
	if err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req := ratekit.Request{Key: "10.0.0." + strconv.FormatInt(n.Add(1), 10), Cost: 1}
		h := http.Header{}
		ctx := context.Background()
		for pb.Next() {
			if res := g.Check(ctx, req, h); res.Status != 0 {
				b.Fatal(res.Status)
			}
		}
	})
}

// BenchmarkGuardObserve measures Guard.Check on an in-memory token bucket:
// without an observer (the decision path as it is without observability),
// with a GuardConfig.Observer (only failures reach it, so this must cost
// nothing), and with the limiter wrapped by Observe and no-op functions
// (the wrapper's own cost: two clock reads and two calls).
func BenchmarkGuardObserve(b *testing.B) {
	nop := &ratekit.Observer{
		DecisionStart: func(ctx context.Context, _ ratekit.DecisionStartEvent) context.Context { return ctx },
		Decision:      func(context.Context, ratekit.DecisionEvent) {},
		FailurePolicy: func(context.Context, ratekit.FailureEvent) {},
	}
	b.Run("none", func(b *testing.B) {
		benchGuard(b, httplimit.GuardConfig{Limiter: benchLimiter(b)})
	})
	b.Run("guard-observer", func(b *testing.B) {
		benchGuard(b, httplimit.GuardConfig{Limiter: benchLimiter(b), Observer: nop})
	})
	b.Run("observed-nop", func(b *testing.B) {
		benchGuard(b, httplimit.GuardConfig{Limiter: ratekit.Observe(benchLimiter(b), nop), Observer: nop})
	})
}
