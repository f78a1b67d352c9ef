package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
)

// BenchmarkOneCaller measures a lone caller's decision through a go-redis
// client built with redis.NewClient's defaults, beside what the same
// client pays for a bare command: INCR, and EVALSHA of a script that runs
// one INCR. Update is the store's take alone, Allow a tokenbucket decision
// in Atomic mode (what a function instance makes per request); the
// Serverless cases run INCR and Allow through a client configured by
// ServerlessOptions. Each reports allocations and system calls per call
// (redistest.BenchOneCaller).
func BenchmarkOneCaller(b *testing.B) {
	p := redistest.Prefix(b)
	c := newClient(b, testenv.RedisAddr(b), p)
	s, err := redisstore.New(c, redisstore.Config{Prefix: p})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("INCR", func(b *testing.B) {
		redistest.BenchOneCaller(b, func(ctx context.Context) error { return c.Incr(ctx, p+"incr").Err() })
	})
	b.Run("EVALSHA", func(b *testing.B) {
		script := redis.NewScript("return redis.call('incr', KEYS[1])")
		keys := []string{p + "eval"}
		redistest.BenchOneCaller(b, func(ctx context.Context) error { return script.Run(ctx, c, keys).Err() })
	})
	b.Run("Update", func(b *testing.B) {
		r := kvstore.Refill{Burst: 1e12, Rate: 1e6}
		redistest.BenchOneCaller(b, func(ctx context.Context) error {
			_, err := s.Update(ctx, "update", r, kvstore.OpTake, 1)
			return err
		})
	})
	b.Run("Allow", func(b *testing.B) { redistest.BenchOneCallerAllow(b, s) })
	// The client ServerlessOptions configures, whose lone caller polls
	// its socket for the reply (see ServerlessOptions).
	sc := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: []string{testenv.RedisAddr(b)}}, time.Second))
	b.Cleanup(func() { sc.Close() })
	ss, err := redisstore.New(sc, redisstore.Config{Prefix: p})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("ServerlessINCR", func(b *testing.B) {
		redistest.BenchOneCaller(b, func(ctx context.Context) error { return sc.Incr(ctx, p+"incr").Err() })
	})
	b.Run("ServerlessAllow", func(b *testing.B) { redistest.BenchOneCallerAllow(b, ss) })
}

// TestOneCallerAllocs pins what a lone caller's decisions allocate on a
// go-redis client built with redis.NewClient's defaults: Update no more
// than go-redis allocates for a bare command (an IntCmd of arguments boxed
// beforehand, through the pool's health check), a tokenbucket decision one
// more (its store key), and a planned decision no more than a composite of
// the same policies (see redistest.CheckOneCallerAllocs).
func TestOneCallerAllocs(t *testing.T) {
	p := redistest.Prefix(t)
	c := newClient(t, testenv.RedisAddr(t), p)
	s, err := redisstore.New(c, redisstore.Config{Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	args := []any{"incr", p + "incr"}
	redistest.CheckOneCallerAllocs(t, s, func(ctx context.Context) error {
		return c.Process(ctx, redis.NewIntCmd(ctx, args...))
	})
}
