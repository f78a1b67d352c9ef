package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/fakeclock"
	"github.com/ratekit/ratekit/internal/plannedtest"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// TestPlannedCalendar runs tokenbucket.Planned's calendar scenarios on
// Redis's clock: the bounds the limiter computes at the scenario's date are
// shifted to the real now, so that Redis decides in that date's periods.
func TestPlannedCalendar(t *testing.T) {
	plannedtest.Run(t, time.Second, func(t *testing.T, c *fakeclock.Clock, plan func(context.Context, string) (ratekit.Plan, error)) plannedtest.Limiter {
		s, rc := newStore(t)
		prefix := s.Key("")
		prefix = prefix[:len(prefix)-2] // without the braces of an empty key
		shifted := plannedtest.NewShifted(s, c.Now, func(ctx context.Context, delta int64) error { return rebase(ctx, rc, prefix, delta) })
		l, err := tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Prefix: "api", Store: shifted, Plan: plan, Now: c.Now})
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

// TestPlannedConcurrent: 8 goroutines on one key of a monthly quota of 50
// admit exactly min(demand, quota), and Usage reads back the sum of the
// admitted costs; on one server and on a Redis Cluster (with Group).
func TestPlannedConcurrent(t *testing.T) {
	t.Run("Server", func(t *testing.T) {
		s, _ := newStore(t)
		plannedtest.CheckConcurrent(t, s, false)
	})
	t.Run("Cluster", func(t *testing.T) {
		cluster := redistest.StartCluster(t, 3)
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
		t.Cleanup(func() { c.Close() })
		s, err := redisstore.New(c, redisstore.Config{Prefix: redistest.Prefix(t)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Prefix: "api", Store: s, Plan: (&plannedtest.Plans{}).Plan}); err == nil {
			t.Fatal("NewPlanned on a cluster without Group succeeded")
		}
		plannedtest.CheckConcurrent(t, s, true)
	})
}

// rebase moves every period record under prefix by delta µs: the period
// its field names and its expiry, a minute after the period's end (see
// plannedtest.Shifted).
func rebase(ctx context.Context, c *redis.Client, prefix string, delta int64) error {
	keys, err := c.Keys(ctx, prefix+"*").Result()
	if err != nil {
		return err
	}
	now := time.Now().UnixMilli()
	for _, k := range keys {
		h, err := c.HGetAll(ctx, k).Result()
		if err != nil || len(h) != 1 {
			continue // a bucket's record: buckets run on the real clock
		}
		for field, count := range h {
			start, end, _ := strings.Cut(field, " ")
			s, err1 := strconv.ParseInt(start, 10, 64)
			e, err2 := strconv.ParseInt(end, 10, 64)
			if err1 != nil || err2 != nil {
				return fmt.Errorf("record %q of %s: %v, %v", field, k, err1, err2)
			}
			exp := (e+delta+999)/1000 + 60_000
			if _, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Del(ctx, k)
				if exp > now {
					p.HSet(ctx, k, strconv.FormatInt(s+delta, 10)+" "+strconv.FormatInt(e+delta, 10), count)
					p.PExpireAt(ctx, k, time.UnixMilli(exp))
				}
				return nil
			}); err != nil {
				return err
			}
		}
	}
	return nil
}

// BenchmarkPlannedAllow measures a decision of a burst and a monthly quota
// with a plan lookup (tokenbucket.Planned, one script that reads TIME)
// against the same two policies in a fixed tokenbucket.Composite, on the
// shared test Redis, from parallel goroutines over 1,024 keys.
func BenchmarkPlannedAllow(b *testing.B) {
	p := redistest.Prefix(b)
	c := newClient(b, testenv.RedisAddr(b), p)
	s, err := redisstore.New(c, redisstore.Config{Prefix: p})
	if err != nil {
		b.Fatal(err)
	}
	plannedtest.Bench(b, s)
}

// TestPlannedShortWindowsOnRedis: Redis reads its clock a round trip after
// tokenbucket.Planned computed a fixed window's bounds, so a window of a
// millisecond failed decisions with ErrClockSkew from latency alone. Such
// a window is refused as a configuration error on every decision, never a
// clock skew; decisions of 8 goroutines on a window of
// tokenbucket.MinFixedWindow never fail. A bucket that fills faster than
// Redis's millisecond clock step is refused too.
func TestPlannedShortWindowsOnRedis(t *testing.T) {
	s, _ := newStore(t)
	plans := &plannedtest.Plans{}
	plans.Set("ms", ratekit.Plan{Name: "ms", Policies: []ratekit.Policy{{Name: "w", Quota: 1 << 40, Window: time.Millisecond, Algorithm: ratekit.FixedWindow}}})
	plans.Set("min", ratekit.Plan{Name: "min", Policies: []ratekit.Policy{{Name: "w", Quota: 1 << 40, Window: tokenbucket.MinFixedWindow, Algorithm: ratekit.FixedWindow}}})
	plans.Set("fast", ratekit.Plan{Name: "fast", Policies: []ratekit.Policy{{Name: "b", Quota: 5, Window: 500 * time.Microsecond, Algorithm: ratekit.TokenBucket}}})
	l, err := tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Prefix: "api", Store: s, Plan: plans.Plan})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const goroutines, each = 8, 300
	var wg sync.WaitGroup
	errs := make(chan error, 2*goroutines*each)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if _, err := l.Allow(ctx, ratekit.Request{Key: "ms", Cost: 1}); !errors.Is(err, ratekit.ErrInvalidConfig) {
					errs <- fmt.Errorf("a 1ms window: %v, want ErrInvalidConfig", err)
				}
				if _, err := l.Allow(ctx, ratekit.Request{Key: "min", Cost: 1}); err != nil {
					errs <- fmt.Errorf("a window of MinFixedWindow: %w", err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if n++; n <= 5 {
			t.Error(err)
		}
	}
	if n > 0 {
		t.Errorf("%d of %d decisions failed", n, 2*goroutines*each)
	}
	if _, err := l.Allow(ctx, ratekit.Request{Key: "fast", Cost: 1}); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Errorf("a bucket filling in 500µs: %v, want ErrInvalidConfig", err)
	}
	if _, err := tokenbucket.New(tokenbucket.Config{Name: "fast", Burst: 5, RefillRate: tokenbucket.Rate{Tokens: 5, Per: 500 * time.Microsecond}, Mode: tokenbucket.Atomic, Store: s}); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Errorf("New, a bucket filling in 500µs: %v, want ErrInvalidConfig", err)
	}
}

// TestPlannedExtremes runs plannedtest.CheckExtremes on Redis.
func TestPlannedExtremes(t *testing.T) {
	s, _ := newStore(t)
	plannedtest.CheckExtremes(t, s)
}

// BenchmarkPlannedRatio measures BenchmarkPlannedAllow's two limiters in
// alternating rounds in one process (redistest.BenchPlannedRatio) and
// reports the median of planned ÷ composite time.
func BenchmarkPlannedRatio(b *testing.B) {
	p := redistest.Prefix(b)
	c := newClient(b, testenv.RedisAddr(b), p)
	s, err := redisstore.New(c, redisstore.Config{Prefix: p})
	if err != nil {
		b.Fatal(err)
	}
	redistest.BenchPlannedRatio(b, s)
}
