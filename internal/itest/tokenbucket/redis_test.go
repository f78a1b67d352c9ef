package tokenbucket_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/itest/redisclient"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// redisStore returns a store on the shared test Redis under a key prefix of
// its own, deleting its keys and closing its client at cleanup, and a hook
// that counts the commands the client sends.
func redisStore(t *testing.T) (*redisstore.Store, *redisclient.CommandCounter) {
	t.Helper()
	addr := testenv.RedisAddr(t)
	b := make([]byte, 6)
	rand.Read(b)
	prefix := "ratekit-test:tokenbucket:" + strings.ReplaceAll(t.Name(), "/", ".") + ":" + hex.EncodeToString(b) + ":"
	c := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: []string{addr}}, time.Second))
	counter := &redisclient.CommandCounter{}
	c.AddHook(counter)
	redisclient.DeleteAtCleanup(t, c, prefix)
	s, err := redisstore.New(c, redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return s, counter
}

func TestRedisAtomicExactUnderConcurrency(t *testing.T) {
	for _, cache := range []int{0, 1000} {
		store, _ := redisStore(t)
		l := newLimiter(t, tokenbucket.Config{Name: "p", Burst: 100, RefillRate: tokenbucket.PerHour(1), Mode: tokenbucket.Atomic, Store: store, DeniedCacheSize: cache})
		if got := hammer(t, l, 64, 50); got != 100 {
			t.Errorf("denied cache %d: %d admitted, want exactly 100", cache, got)
		}
	}
}

// TestRedisClusterAtomicExact runs Atomic mode on a throwaway Redis Cluster
// of 3 masters through a go-redis ClusterClient: 12 keys, each hammered by
// 32 goroutines at once (384 in all, so the Store coalesces commands for
// several masters into pipelines), admit exactly Burst each, and the keys
// land on every master. A fresh master knows no script, so each one answers
// NOSCRIPT first and the EVAL fallback loads it.
func TestRedisClusterAtomicExact(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), PoolSize: 16})
	t.Cleanup(func() { client.Close() })
	counter := &redisclient.CommandCounter{}
	client.AddHook(counter)
	store, err := redisstore.New(client, redisstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const burst, keys, workers, perWorker = 50, 12, 32, 10
	l := newLimiter(t, tokenbucket.Config{Name: "p", Burst: burst, RefillRate: tokenbucket.PerHour(1), Mode: tokenbucket.Atomic, Store: store})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var (
		admitted [keys]atomic.Int64
		wg       sync.WaitGroup
		errs     = make(chan error, keys*workers)
		start    = make(chan struct{})
	)
	for k := range keys {
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for range perWorker {
					d, err := l.Allow(ctx, ratekit.Request{Key: fmt.Sprintf("user:%d", k), Cost: 1})
					if err != nil {
						errs <- err
						return
					}
					if d.Allowed {
						admitted[k].Add(1)
					}
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k := range keys {
		if got := admitted[k].Load(); got != burst {
			t.Errorf("key user:%d: %d admitted by %d goroutines, want exactly %d", k, got, workers, burst)
		}
	}
	if counter.Pipelined.Load() == 0 {
		t.Error("no command went in a coalesced pipeline; the test does not exercise ClusterClient pipelines")
	}
	var mu sync.Mutex
	perMaster := map[string]int64{}
	err = client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		mu.Lock()
		perMaster[m.Options().Addr] = n
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(perMaster) != 3 {
		t.Fatalf("ForEachMaster saw %d masters, want 3", len(perMaster))
	}
	for addr, n := range perMaster {
		if n == 0 {
			t.Errorf("master %s holds no key (keys per master: %v); the test's keys must spread over all masters", addr, perMaster)
		}
	}
}

func TestRedisBothModes(t *testing.T) {
	for _, mode := range []tokenbucket.Mode{tokenbucket.Eventual, tokenbucket.Atomic} {
		t.Run(mode.String(), func(t *testing.T) {
			store, counter := redisStore(t)
			// Burst 3, one token every 20 minutes: nothing refills during the test.
			l := newLimiter(t, tokenbucket.Config{Name: "p", Burst: 3, RefillRate: tokenbucket.PerHour(3), Mode: mode, Store: store})
			ctx := context.Background()
			req := ratekit.Request{Key: "user:1", Cost: 1}
			for i := 0; i < 3; i++ {
				if d, err := l.Allow(ctx, req); err != nil || !d.Allowed || d.Remaining != int64(2-i) {
					t.Fatalf("request %d: %+v, %v", i, d, err)
				}
			}
			before := counter.N.Load()
			d, err := l.Allow(ctx, req)
			if err != nil || d.Allowed || d.Remaining != 0 {
				t.Fatalf("fourth request: %+v, %v", d, err)
			}
			if sent := counter.N.Load() - before; sent != 1 {
				t.Errorf("a denied %v decision sent %d commands, want 1 (denials write nothing)", mode, sent)
			}
			// RetryAfter is a little under 20 minutes (time passed since the
			// first take), ResetAfter a little under an hour.
			if d.RetryAfter > 20*time.Minute || d.RetryAfter < 20*time.Minute-10*time.Second ||
				d.ResetAfter > time.Hour || d.ResetAfter < time.Hour-10*time.Second {
				t.Fatalf("denied decision %+v", d)
			}
			if p, err := l.Peek(ctx, req); err != nil || p.Allowed || p.Remaining != 0 {
				t.Fatalf("Peek: %+v, %v", p, err)
			}
			if r, err := l.Refund(ctx, ratekit.Request{Key: "user:1", Cost: 2}); err != nil || r.Remaining != 2 {
				t.Fatalf("Refund 2: %+v, %v", r, err)
			}
			if err := l.Reset(ctx, "user:1"); err != nil {
				t.Fatal(err)
			}
			if p, err := l.Peek(ctx, ratekit.Request{Key: "user:1", Cost: 3}); err != nil || !p.Allowed || p.Remaining != 3 || p.ResetAfter != 0 {
				t.Fatalf("Peek after Reset: %+v, %v", p, err)
			}
		})
	}
}

func TestRedisDeniedCacheAnswersWithoutRoundTrip(t *testing.T) {
	store, counter := redisStore(t)
	l := newLimiter(t, tokenbucket.Config{Name: "p", Burst: 2, RefillRate: tokenbucket.PerHour(1), Mode: tokenbucket.Atomic, Store: store, DeniedCacheSize: 100})
	ctx := context.Background()
	req := ratekit.Request{Key: "blocked", Cost: 1}
	for i := 0; i < 3; i++ {
		l.Allow(ctx, req)
	}
	before := counter.N.Load()
	for i := 0; i < 1000; i++ {
		if d, err := l.Allow(ctx, req); err != nil || d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("blocked request %d: %+v, %v", i, d, err)
		}
	}
	if sent := counter.N.Load() - before; sent != 0 {
		t.Fatalf("1000 requests from a blocked client sent %d commands, want 0", sent)
	}
}

// TestRedisDownFailsWithinDeadlineAndRecovers stops a throwaway Redis of its
// own: Allow must return an error (never a decision) within the caller's
// deadline, and succeed again once Redis is back, with no help.
func TestRedisDownFailsWithinDeadlineAndRecovers(t *testing.T) {
	srv := redistest.Start(t)
	addr := srv.Addr
	client := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: []string{addr}}, 0))
	t.Cleanup(func() { client.Close() })
	store, _ := redisstore.New(client, redisstore.Config{})
	l := newLimiter(t, tokenbucket.Config{Name: "p", Burst: 10, RefillRate: tokenbucket.PerSecond(10), Mode: tokenbucket.Atomic, Store: store})
	allow := func(d time.Duration) (ratekit.Decision, time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		begin := time.Now()
		dec, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: 1})
		return dec, time.Since(begin), err
	}
	// Recovering, like setting up (dialling, loading the script), must
	// happen, not within a time that a busy machine may exceed: both retry
	// for up to 20 s.
	succeeds := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			dec, _, err := allow(time.Second)
			if err == nil && dec.Allowed {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no decision succeeded in 20s %s: %+v, %v", what, dec, err)
			}
		}
	}
	late := testenv.MeasureLateness(t)
	succeeds("before Redis stopped")
	srv.Stop()
	for i := 0; i < 3; i++ {
		dec, took, err := allow(200 * time.Millisecond)
		if err == nil {
			t.Fatalf("Allow with Redis down = %+v, nil error", dec)
		}
		if !reflect.DeepEqual(dec, ratekit.Decision{}) {
			t.Fatalf("Allow with Redis down returned a decision %+v with its error", dec)
		}
		if lateness := late.Max(); took > 350*time.Millisecond+lateness {
			t.Fatalf("Allow with Redis down took %v, deadline 200ms (+150ms + scheduling lateness %v)", took, lateness)
		}
	}
	srv.Restart()
	succeeds("after Redis came back")
	// A canceled context is reported as such.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: 1}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Allow with a canceled context: %v, want context.Canceled", err)
	}
}

// BenchmarkAllowRedis measures one atomic decision over Redis on one hot key
// that never denies (the comparison with redis_rate and INCR is in
// benchmarks/tokenbucket/rediscompare).
func BenchmarkAllowRedis(b *testing.B) {
	addr := testenv.RedisAddr(b)
	c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr}})
	defer c.Close()
	buf := make([]byte, 6)
	rand.Read(buf)
	prefix := "ratekit-bench:" + hex.EncodeToString(buf) + ":"
	store, _ := redisstore.New(c, redisstore.Config{Prefix: prefix})
	l := newLimiter(b, tokenbucket.Config{Name: "bench", Burst: 1 << 30, RefillRate: tokenbucket.PerHour(1 << 30), Mode: tokenbucket.Atomic, Store: store})
	ctx := context.Background()
	defer l.Reset(ctx, "hot")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Allow(ctx, ratekit.Request{Key: "hot", Cost: 1}); err != nil {
			b.Fatal(err)
		}
	}
}
