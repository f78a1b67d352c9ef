package rueidisstore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
	"github.com/ratekit/ratekit/kvstore/storetest"
)

// routed is a rueidis client that counts the calls sent through its
// pipelined connections (Do, DoMulti) and through dedicated ones.
type routed struct {
	rueidis.Client
	pipelined, dedicated atomic.Int64
}

func (r *routed) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	r.pipelined.Add(1)
	return r.Client.Do(ctx, cmd)
}

func (r *routed) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	r.pipelined.Add(1)
	return r.Client.DoMulti(ctx, cmds...)
}

func (r *routed) Dedicated(fn func(rueidis.DedicatedClient) error) error {
	r.dedicated.Add(1)
	return r.Client.Dedicated(fn)
}

// burst makes 16 goroutines decide at once through s, 20 times each, so
// that s sees its commands in flight together and rueidis pipelines the
// connections they share.
func burst(t testing.TB, s *rueidisstore.Store) {
	t.Helper()
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			<-start
			for range 20 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := s.Update(ctx, "burst", kvstore.Refill{Burst: 1, Rate: 1}, kvstore.OpPeek, 1)
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
}

// TestLoneCommandsAfterBurst: a lone caller's commands go on the client's
// connections until the store has seen two of them in flight at once, and
// on a dedicated connection after that (which serves them on the caller's
// goroutine, where rueidis's pipelined connections would hand each to a
// writer and a reader goroutine); a context that can end without a
// deadline keeps to the pipelined connections, which rueidis pipelines
// for it anyway.
func TestLoneCommandsAfterBurst(t *testing.T) {
	p := redistest.Prefix(t)
	c := &routed{Client: newClient(t, testenv.RedisAddr(t))}
	cleanKeys(t, c, p)
	s, err := rueidisstore.New(c, rueidisstore.Config{Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	decide := func(op kvstore.Op) {
		t.Helper()
		if _, err := s.Update(ctx, "k", slow, op, big); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		decide(kvstore.OpTake)
	}
	if p, d := c.pipelined.Load(), c.dedicated.Load(); p != 5 || d != 0 {
		t.Fatalf("5 takes before a burst: %d pipelined and %d dedicated calls, want 5 and 0", p, d)
	}
	burst(t, s)
	p0, d0 := c.pipelined.Load(), c.dedicated.Load()
	for range 5 {
		decide(kvstore.OpTake)
		decide(kvstore.OpPeek) // MULTI/EXEC
	}
	if p, d := c.pipelined.Load()-p0, c.dedicated.Load()-d0; p != 0 || d != 10 {
		t.Errorf("5 takes and 5 peeks after a burst: %d pipelined and %d dedicated calls, want 0 and 10", p, d)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	defer ccancel()
	p0, d0 = c.pipelined.Load(), c.dedicated.Load()
	if _, err := s.Update(cctx, "k", slow, kvstore.OpTake, big); err != nil {
		t.Fatal(err)
	}
	if p, d := c.pipelined.Load()-p0, c.dedicated.Load()-d0; p != 1 || d != 0 {
		t.Errorf("a take whose context has no deadline: %d pipelined and %d dedicated calls, want 1 and 0", p, d)
	}
	if res, err := s.Update(ctx, "k", slow, kvstore.OpPeek, 1); err != nil || !near(res.Remaining, slow.Burst-11*big) {
		t.Errorf("after 11 takes of %d the level is %+v, %v; want about %d", int64(big), res, err, slow.Burst-11*big)
	}
}

// TestConformanceAfterBurst runs the kvstore suite on stores that have
// served a burst, whose lone commands go on dedicated connections.
func TestConformanceAfterBurst(t *testing.T) {
	storetest.Run(t, func(t *testing.T) kvstore.Store {
		s, _ := newStore(t)
		burst(t, s)
		return s
	})
}
