package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit/internal/faultproxy"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
)

// coalescingStore returns a store on the shared test Redis that allows one
// round trip in flight, so that concurrent commands queue and go in
// pipelines, and the counter of the commands its client sends.
func coalescingStore(t *testing.T) (*redisstore.Store, *redistest.CommandCounter) {
	t.Helper()
	s, c := newStoreMaxInFlight(t, 1)
	counter := &redistest.CommandCounter{}
	c.AddHook(counter)
	return s, counter
}

// TestCoalescedUpdatesAreExact races 64 goroutines on one round trip in
// flight. On one shared bucket of 100, exactly 100 takes succeed. On a
// bucket of its own, each goroutine takes its own cost and must see its own
// levels in order: a result handed to the wrong caller breaks a sequence.
// The test fails unless some commands actually went in pipelines.
func TestCoalescedUpdatesAreExact(t *testing.T) {
	s, counter := coalescingStore(t)
	ctx := context.Background()
	// Both refill one unit a microsecond. A token of the shared bucket
	// is 2^30 units, so it refills less than one token in 17 minutes;
	// the takes from the own buckets are far larger than what refills
	// during the test.
	shared := kvstore.Refill{Max: 100 << 30, Rate: 1}
	own := kvstore.Refill{Max: 1 << 40, Rate: 1}
	const workers, takes = 64, 20
	var (
		admitted atomic.Int64
		wg       sync.WaitGroup
		errs     = make(chan error, workers)
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "own-" + strconv.Itoa(w)
			cost := int64(w+1) << 20
			for i := range takes {
				res, err := s.Update(ctx, "shared", shared, kvstore.OpTake, 1<<30)
				if err != nil {
					errs <- err
					return
				}
				if res.OK {
					admitted.Add(1)
				}
				res, err = s.Update(ctx, key, own, kvstore.OpTake, cost)
				if err != nil {
					errs <- err
					return
				}
				// The level after take i+1, plus what refilled since
				// the first take (one unit a microsecond).
				want := own.Max - int64(i+1)*cost
				if !res.OK || res.Value < want || res.Value > want+int64(time.Minute/time.Microsecond) {
					errs <- errors.New(key + ": take " + strconv.Itoa(i+1) + " got level " + strconv.FormatInt(res.Value, 10) + ", want about " + strconv.FormatInt(want, 10))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := admitted.Load(); got != 100 {
		t.Fatalf("%d takes of one token admitted from a bucket of 100 tokens, want exactly 100", got)
	}
	if counter.Pipelined.Load() == 0 {
		t.Fatal("no command went in a pipeline: the test did not exercise coalescing")
	}
	t.Logf("%d commands, %d of them in pipelines", counter.N.Load(), counter.Pipelined.Load())
}

// TestQueuedCallerStopsAtItsDeadline holds the one round trip in flight
// behind 300ms of latency and queues callers with a 50ms deadline behind
// it: each returns context.DeadlineExceeded within its deadline (plus the
// slack of a loaded machine), and none of them is sent later, since they
// left the queue before a round trip took it. Then the slow caller gets its
// result.
func TestQueuedCallerStopsAtItsDeadline(t *testing.T) {
	srv := redistest.Start(t)
	proxy := faultproxy.Start(t, srv.Addr)
	c := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: []string{proxy.Listen}}, time.Second))
	t.Cleanup(func() { c.Close() })
	s, _ := redisstore.New(c, redisstore.Config{MaxInFlight: 1})
	// A take is 2^30 units, which refill in 18 minutes.
	r := kvstore.Refill{Max: 10 << 30, Rate: 1}
	take := func(d time.Duration) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		start := time.Now()
		_, err := s.Update(ctx, "k", r, kvstore.OpTake, 1<<30)
		return time.Since(start), err
	}
	if _, err := take(time.Second); err != nil { // also loads the script
		t.Fatal(err)
	}
	if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(`{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":300}}`)); err != nil {
		t.Fatal(err)
	}
	slow := make(chan error, 1)
	go func() {
		_, err := take(2 * time.Second)
		slow <- err
	}()
	time.Sleep(20 * time.Millisecond) // the slow update holds the round trip
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			took, err := take(50 * time.Millisecond)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("queued update: %v, want context.DeadlineExceeded", err)
			}
			if took > 50*time.Millisecond+slack {
				t.Errorf("queued update took %v, deadline 50ms", took)
			}
		}()
	}
	wg.Wait()
	if err := <-slow; err != nil {
		t.Fatalf("the update holding the round trip: %v", err)
	}
	if err := proxy.Toxics.RemoveToxic(context.Background(), "slow"); err != nil {
		t.Fatal(err)
	}
	res, err := s.Update(context.Background(), "k", r, kvstore.OpPeek, 1)
	if err != nil {
		t.Fatal(err)
	}
	// Two takes: the first update and the slow one; a queued update that
	// was sent after its caller left would have taken another 2^30.
	if want := r.Max - 2<<30; res.Value < want || res.Value > want+int64(time.Minute/time.Microsecond) {
		t.Fatalf("level %d after two takes of 2^30 from %d, want about %d", res.Value, r.Max, want)
	}
}

// TestPipelineAfterScriptFlush sends updates in pipelines to a server that
// lost the script: every update gets NOSCRIPT in its pipeline, is sent again
// with EVAL, and counts once.
func TestPipelineAfterScriptFlush(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	counter := &redistest.CommandCounter{}
	c.AddHook(counter)
	s, _ := redisstore.New(c, redisstore.Config{MaxInFlight: 1})
	ctx := context.Background()
	r := kvstore.Refill{Max: 1 << 40, Rate: 1}
	for round := range 3 {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		before := counter.Pipelined.Load()
		var wg sync.WaitGroup
		for range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if res, err := s.Update(ctx, "k", r, kvstore.OpTake, 1<<20); err != nil || !res.OK {
					t.Errorf("round %d: Update after SCRIPT FLUSH = %+v, %v", round, res, err)
				}
			}()
		}
		wg.Wait()
		if counter.Pipelined.Load() == before {
			t.Fatalf("round %d: no command went in a pipeline", round)
		}
	}
	res, err := s.Update(ctx, "k", r, kvstore.OpPeek, 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := r.Max - 96<<20; res.Value < want || res.Value > want+int64(time.Minute/time.Microsecond) {
		t.Fatalf("level %d after 96 takes of 2^20 from 2^40, want about %d", res.Value, want)
	}
}

// TestCoalescingUnderFaults runs 64 goroutines with deadlines from 2 to 20ms
// through a proxy that adds 2±2ms each way and resets every connection for
// 10ms in every 100ms, with two round trips in flight, so that callers give
// up while queued, while their pipeline is on the wire and while it is
// reset. Every call returns by its deadline (plus slack), and the level
// Redis holds at the end accounts for every reported take: at least the
// admitted ones, at most those plus the ones that failed (a reset can cut
// the reply of a take Redis ran). Under -race this also checks that a
// pipeline still on the wire never touches what a caller that left reuses;
// TestMain checks that no flushing goroutine outlives the test.
func TestCoalescingUnderFaults(t *testing.T) {
	srv := redistest.Start(t)
	proxy := faultproxy.Start(t, srv.Addr)
	c := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: []string{proxy.Listen}, PoolSize: 4}, 20*time.Millisecond))
	t.Cleanup(func() { c.Close() })
	counter := &redistest.CommandCounter{}
	c.AddHook(counter)
	s, _ := redisstore.New(c, redisstore.Config{MaxInFlight: 2})
	// A take is 2^30 units; the rate refills less than one take during
	// the test.
	r := kvstore.Refill{Max: 1 << 50, Rate: 1}
	if _, err := s.Update(context.Background(), "k", r, kvstore.OpPeek, 1); err != nil { // loads the script
		t.Fatal(err)
	}
	proxy.Latency(2*time.Millisecond, 2*time.Millisecond)
	proxy.ResetEvery(100*time.Millisecond, 10*time.Millisecond)
	const workers = 64
	var (
		admitted, failed, timedOut atomic.Int64
		wg                         sync.WaitGroup
		end                        = time.Now().Add(time.Second)
	)
	for w := range workers {
		wg.Go(func() {
			for i := 0; time.Now().Before(end); i++ {
				d := time.Duration(2+(w*7+i*3)%19) * time.Millisecond
				ctx, cancel := context.WithTimeout(context.Background(), d)
				start := time.Now()
				_, err := s.Update(ctx, "k", r, kvstore.OpTake, 1<<30)
				took := time.Since(start)
				cancel()
				switch {
				case err == nil:
					admitted.Add(1)
				case errors.Is(err, context.DeadlineExceeded):
					timedOut.Add(1)
					failed.Add(1)
				default:
					failed.Add(1)
				}
				if took > d+slack {
					t.Errorf("update with a %v deadline returned after %v: %v", d, took, err)
				}
			}
		})
	}
	wg.Wait()
	proxy.Heal()
	// Let pipelines whose callers left reach Redis before reading.
	time.Sleep(100 * time.Millisecond)
	res, err := s.Update(context.Background(), "k", r, kvstore.OpPeek, 1)
	if err != nil {
		t.Fatal(err)
	}
	taken := (r.Max - res.Value + 1<<30 - 1) >> 30
	t.Logf("%d admitted, %d failed (%d at their deadline), %d taken in Redis; %d commands, %d in pipelines",
		admitted.Load(), failed.Load(), timedOut.Load(), taken, counter.N.Load(), counter.Pipelined.Load())
	if admitted.Load() < 100 || timedOut.Load() == 0 || counter.Pipelined.Load() == 0 {
		t.Fatal("the run did not exercise admissions, deadlines and pipelines together")
	}
	if taken < admitted.Load() || taken > admitted.Load()+failed.Load() {
		t.Fatalf("Redis took %d, want between the %d admitted and %d (admitted plus failed)", taken, admitted.Load(), admitted.Load()+failed.Load())
	}
}
