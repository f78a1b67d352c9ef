package breaker_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/breaker"
	"github.com/ratekit/ratekit/internal/leakcheck"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func req() ratekit.Request { return ratekit.Request{Key: "k", Cost: 1} }

// dialCounter counts the dials a go-redis client makes.
type dialCounter struct{ n atomic.Int64 }

func (d *dialCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.n.Add(1)
		return next(ctx, network, addr)
	}
}
func (d *dialCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (d *dialCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRedisOutageDials stops a throwaway Redis under a token bucket: without
// the breaker every request dials the dead server; with it, only the
// requests before the circuit opens and the probes do; after the server
// returns, the circuit closes and decisions succeed again.
func TestRedisOutageDials(t *testing.T) {
	srv := redistest.Start(t)
	for _, withBreaker := range []bool{false, true} {
		dials := &dialCounter{}
		client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1,
			DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond,
			DialerRetries: 1})
		client.AddHook(dials)
		store, err := redisstore.New(client, redisstore.Config{})
		if err != nil {
			t.Fatal(err)
		}
		var l ratekit.Limiter
		l, err = tokenbucket.New(tokenbucket.Config{Name: "p", Burst: 100, RefillRate: tokenbucket.PerHour(100), Mode: tokenbucket.Atomic, Store: store})
		if err != nil {
			t.Fatal(err)
		}
		var b *breaker.Limiter
		if withBreaker {
			b, err = breaker.New(l, breaker.Config{Failures: 3, OpenFor: 300 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			l = b
		}
		ctx := context.Background()
		if _, err := l.Allow(ctx, req()); err != nil {
			t.Fatal(err)
		}
		srv.Stop()
		before := dials.n.Load()
		for i := 0; i < 50; i++ {
			if _, err := l.Allow(ctx, req()); err == nil {
				t.Fatal("a decision succeeded with Redis stopped")
			}
		}
		n := dials.n.Load() - before
		t.Logf("breaker %v: 50 requests during the outage dialled %d times", withBreaker, n)
		// go-redis itself stops dialling for a while after PoolSize dial
		// errors in a row, so without the breaker a dial per request is
		// not guaranteed; many more than the breaker's are.
		if !withBreaker && n <= 10 {
			t.Fatalf("without the breaker, 50 requests dialled %d times; want more than 10", n)
		}
		if withBreaker {
			if n > 3 {
				t.Fatalf("with the breaker, 50 requests dialled %d times; want at most 3", n)
			}
			if b.State() != breaker.Open {
				t.Fatalf("state %v during the outage", b.State())
			}
		}
		srv.Restart()
		if withBreaker {
			time.Sleep(350 * time.Millisecond)
		}
		// After a run of dial errors go-redis answers with the last one
		// until a background redial succeeds (about a second).
		var d ratekit.Decision
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if d, err = l.Allow(ctx, req()); err == nil {
				break
			}
		}
		if err != nil || !d.Allowed {
			t.Fatalf("after Redis returned: %+v, %v", d, err)
		}
		if withBreaker && b.State() != breaker.Closed {
			t.Fatalf("state %v after a good probe", b.State())
		}
		client.Close()
	}
}
