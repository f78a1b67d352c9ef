package rueidisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
)

// BenchmarkOneCaller measures a lone caller's decision through a rueidis
// client built with rueidis's defaults, beside what the same client pays
// for a bare command: INCR, and EVALSHA of a script that runs one INCR.
// Update is the store's take alone, Allow a tokenbucket decision in Atomic
// mode (what a function instance makes per request); the Serverless
// cases run INCR and Allow through a client configured by
// ServerlessOptions. Each reports allocations and system calls per call
// (redistest.BenchOneCaller).
func BenchmarkOneCaller(b *testing.B) {
	p := redistest.Prefix(b)
	c := newClient(b, testenv.RedisAddr(b))
	cleanKeys(b, c, p)
	s, err := rueidisstore.New(c, rueidisstore.Config{Prefix: p})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("INCR", func(b *testing.B) {
		key := p + "incr"
		redistest.BenchOneCaller(b, func(ctx context.Context) error { return c.Do(ctx, c.B().Incr().Key(key).Build()).Error() })
	})
	b.Run("EVALSHA", func(b *testing.B) {
		script := rueidis.NewLuaScript("return redis.call('incr', KEYS[1])")
		keys := []string{p + "eval"}
		redistest.BenchOneCaller(b, func(ctx context.Context) error { return script.Exec(ctx, c, keys, nil).Error() })
	})
	b.Run("Update", func(b *testing.B) {
		r := kvstore.Refill{Burst: 1e12, Rate: 1e6}
		redistest.BenchOneCaller(b, func(ctx context.Context) error {
			_, err := s.Update(ctx, "update", r, kvstore.OpTake, 1)
			return err
		})
	})
	// rueidis pipelines a connection from the first time it sees two
	// commands at once, and keeps it so.
	bc := newClient(b, testenv.RedisAddr(b))
	bs, err := rueidisstore.New(bc, rueidisstore.Config{Prefix: p})
	if err != nil {
		b.Fatal(err)
	}
	burst(b, bs)
	b.Run("INCRAfterBurst", func(b *testing.B) {
		key := p + "incr"
		redistest.BenchOneCaller(b, func(ctx context.Context) error { return bc.Do(ctx, bc.B().Incr().Key(key).Build()).Error() })
	})
	b.Run("UpdateAfterBurst", func(b *testing.B) {
		r := kvstore.Refill{Burst: 1e12, Rate: 1e6}
		redistest.BenchOneCaller(b, func(ctx context.Context) error {
			_, err := bs.Update(ctx, "update", r, kvstore.OpTake, 1)
			return err
		})
	})
	b.Run("Allow", func(b *testing.B) { redistest.BenchOneCallerAllow(b, s) })
	// The client ServerlessOptions configures, whose lone caller polls
	// its socket for the reply (see ServerlessOptions).
	sc, err := rueidis.NewClient(*rueidisstore.ServerlessOptions(&rueidis.ClientOption{InitAddress: []string{testenv.RedisAddr(b)}, DisableCache: true}, time.Second))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(sc.Close)
	ss, err := rueidisstore.New(sc, rueidisstore.Config{Prefix: p})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("ServerlessINCR", func(b *testing.B) {
		key := p + "incr"
		redistest.BenchOneCaller(b, func(ctx context.Context) error { return sc.Do(ctx, sc.B().Incr().Key(key).Build()).Error() })
	})
	b.Run("ServerlessAllow", func(b *testing.B) { redistest.BenchOneCallerAllow(b, ss) })
}

// TestOneCallerAllocs pins what a lone caller's decisions allocate on a
// rueidis client built with rueidis's defaults: Update no more than a bare
// INCR through the same client, a tokenbucket decision one more (its store
// key), and a planned decision no more than a composite of the same
// policies (see redistest.CheckOneCallerAllocs); after a burst, when a
// lone command goes on a dedicated connection, Update one more than INCR
// (the dedicated client rueidis allocates for each use).
func TestOneCallerAllocs(t *testing.T) {
	p := redistest.Prefix(t)
	c := newClient(t, testenv.RedisAddr(t))
	cleanKeys(t, c, p)
	s, err := rueidisstore.New(c, rueidisstore.Config{Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	key := p + "incr"
	incr := func(ctx context.Context) error { return c.Do(ctx, c.B().Incr().Key(key).Build()).Error() }
	redistest.CheckOneCallerAllocs(t, s, incr)
	burst(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := kvstore.Refill{Burst: 1e12, Rate: 1e6}
	bare := testing.AllocsPerRun(200, func() { incr(ctx) })
	update := testing.AllocsPerRun(200, func() { s.Update(ctx, "update", r, kvstore.OpTake, 1) })
	if update > bare+1+redistest.AllocSlack {
		t.Errorf("after a burst, Update allocates %v times, INCR %v", update, bare)
	}
}
