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

	"github.com/ratekit/ratekit/internal/itest/faultproxy"
	"github.com/ratekit/ratekit/internal/itest/redisclient"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
)

// coalescingStore returns a store on the shared test Redis that allows one
// round trip in flight, so that concurrent commands queue and go in
// pipelines, and the counter of the commands its client sends.
func coalescingStore(t *testing.T) (*redisstore.Store, *redisclient.CommandCounter) {
	t.Helper()
	s, c := newStoreMaxInFlight(t, 1)
	counter := &redisclient.CommandCounter{}
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
	shared := kvstore.Refill{Burst: 100 << 30, Rate: 1}
	own := kvstore.Refill{Burst: 1 << 40, Rate: 1}
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
				want := own.Burst - int64(i+1)*cost
				if !res.OK || res.Remaining < want || res.Remaining > want+int64(time.Minute/time.Microsecond) {
					errs <- errors.New(key + ": take " + strconv.Itoa(i+1) + " got level " + strconv.FormatInt(res.Remaining, 10) + ", want about " + strconv.FormatInt(want, 10))
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
	counter := &redisclient.CommandCounter{}
	c.AddHook(counter)
	s, _ := redisstore.New(c, redisstore.Config{MaxInFlight: 1})
	late := testenv.MeasureLateness(t)
	// A take is 2^30 units, which refill in 18 minutes.
	r := kvstore.Refill{Burst: 10 << 30, Rate: 1}
	take := func(d time.Duration) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		start := time.Now()
		_, err := s.Update(ctx, "k", r, kvstore.OpTake, 1<<30)
		return time.Since(start), err
	}
	// Dial and load the script with a peek, patiently: setting up is not
	// under test, and a peek takes nothing whether it fails or not.
	peekPatiently(t, s, r)
	if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(`{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":300}}`)); err != nil {
		t.Fatal(err)
	}
	slow := make(chan error, 1)
	sent := counter.N.Load()
	go func() {
		_, err := take(2 * time.Second)
		slow <- err
	}()
	// The slow update holds the round trip once its command reached the
	// client; a fixed sleep is not enough on a busy machine.
	for wait := time.Now().Add(10 * time.Second); counter.N.Load() == sent; time.Sleep(time.Millisecond) {
		if time.Now().After(wait) {
			t.Fatal("the slow update sent no command in 10s")
		}
	}
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			took, err := take(50 * time.Millisecond)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("queued update: %v, want context.DeadlineExceeded", err)
			}
			if took > 50*time.Millisecond+redistest.Slack {
				if lateness := late.Max(); took > 50*time.Millisecond+redistest.Slack+lateness {
					t.Errorf("queued update took %v, deadline 50ms (slack %v, scheduling lateness %v)", took, redistest.Slack, lateness)
				}
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
	// One take: the slow one; a queued update that was sent after its
	// caller left would have taken another 2^30.
	if want := r.Burst - 1<<30; res.Remaining < want || res.Remaining > want+int64(time.Minute/time.Microsecond) {
		t.Fatalf("level %d after one take of 2^30 from %d, want about %d", res.Remaining, r.Burst, want)
	}
}

// peekPatiently peeks at "k" in s until a peek succeeds, each with a
// second, for at most 20 seconds. A peek dials, loads the script and warms
// the pool without changing the level, so it can be retried: a test calls
// it to set up, which a busy machine may slow past a client's short
// timeouts, and which is not what the test is about.
func peekPatiently(t *testing.T, s *redisstore.Store, r kvstore.Refill) kvstore.OpResult {
	t.Helper()
	var err error
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var res kvstore.OpResult
		res, err = s.Update(ctx, "k", r, kvstore.OpPeek, 1)
		cancel()
		if err == nil {
			return res
		}
	}
	t.Fatalf("no peek succeeded in 20s: %v", err)
	return kvstore.OpResult{}
}

// TestPipelineAfterScriptFlush sends updates in pipelines to a server that
// lost the script: every update gets NOSCRIPT in its pipeline, is sent again
// with EVAL, and counts once.
func TestPipelineAfterScriptFlush(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	counter := &redisclient.CommandCounter{}
	c.AddHook(counter)
	s, _ := redisstore.New(c, redisstore.Config{MaxInFlight: 1})
	ctx := context.Background()
	r := kvstore.Refill{Burst: 1 << 40, Rate: 1}
	// A round flushes the script and starts 32 updates at once; on a busy
	// machine they may still go one by one, so a round is tried again
	// (the updates count all the same) until one of its commands went in a
	// pipeline.
	const batch, tries = 32, 50
	takes := int64(0)
	for round := range 3 {
		for try := 1; ; try++ {
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			before := counter.Pipelined.Load()
			var wg sync.WaitGroup
			start := make(chan struct{})
			for range batch {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					if res, err := s.Update(ctx, "k", r, kvstore.OpTake, 1<<20); err != nil || !res.OK {
						t.Errorf("round %d: Update after SCRIPT FLUSH = %+v, %v", round, res, err)
					}
				}()
			}
			close(start)
			wg.Wait()
			takes += batch
			if counter.Pipelined.Load() > before {
				break
			}
			if try == tries {
				t.Fatalf("round %d: no command went in a pipeline in %d tries", round, tries)
			}
		}
	}
	res, err := s.Update(ctx, "k", r, kvstore.OpPeek, 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := r.Burst - takes<<20; res.Remaining < want || res.Remaining > want+int64(time.Minute/time.Microsecond) {
		t.Fatalf("level %d after %d takes of 2^20 from 2^40, want about %d", res.Remaining, takes, want)
	}
}

// TestCoalescingUnderFaults runs 64 goroutines with deadlines from 2 to 20ms
// (longer on a busy machine that admits nothing in them)
// through a proxy that adds 2±2ms each way and resets every connection for
// 10ms in every 100ms, with two round trips in flight, so that callers give
// up while queued, while their pipeline is on the wire and while it is
// reset. Every call returns by its deadline (plus redistest.Slack), and the level
// Redis holds at the end accounts for every reported take: at least the
// admitted ones, at most those plus the ones that failed (a reset can cut
// the reply of a take Redis ran). Under -race this also checks that a
// pipeline still on the wire never touches what a caller that left reuses;
// TestMain checks that no flushing goroutine outlives the test.
func TestCoalescingUnderFaults(t *testing.T) {
	srv := redistest.Start(t)
	proxy := faultproxy.Start(t, srv.Addr)
	// The callers' deadlines are under test; the client's own timeouts
	// (which bound every command besides the caller's deadline) are
	// patient, so that deadlines can grow on a busy machine (below).
	c := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: []string{proxy.Listen}, PoolSize: 4}, time.Second))
	t.Cleanup(func() { c.Close() })
	counter := &redisclient.CommandCounter{}
	c.AddHook(counter)
	s, _ := redisstore.New(c, redisstore.Config{MaxInFlight: 2})
	// A client of the server itself, with go-redis's patient defaults,
	// sets up and reads the result: neither is under test, and the
	// faulty client's 20ms timeouts can fail them on a busy machine.
	direct := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { direct.Close() })
	ds, _ := redisstore.New(direct, redisstore.Config{})
	late := testenv.MeasureLateness(t)
	// A take is 2^30 units; the rate refills less than one take during
	// the test.
	r := kvstore.Refill{Burst: 1 << 50, Rate: 1}
	peekPatiently(t, ds, r) // loads the script on the server
	peekPatiently(t, s, r)  // dials the client's first connection
	proxy.Latency(2*time.Millisecond, 2*time.Millisecond)
	proxy.ResetEvery(100*time.Millisecond, 10*time.Millisecond)
	const workers = 64
	var (
		admitted, failed, timedOut atomic.Int64
		wg                         sync.WaitGroup
		// The run lasts a second, and longer if a busy machine let it
		// admit fewer than 100 takes or form no pipeline or no deadline
		// expire by then, up to giveUp.
		start       time.Time
		end, giveUp time.Time
		exercised   = func() bool {
			return admitted.Load() >= 100 && timedOut.Load() > 0 && counter.Pipelined.Load() > 0
		}
		// scale multiplies the deadlines: 1 in the first second, then
		// twice as much every second the run goes on, up to 32 (64ms to
		// 640ms): on a busy machine no round trip may finish in 20ms.
		scale = func() time.Duration {
			return 1 << min(time.Since(start)/time.Second, 5)
		}
	)
	// The workers start together once all exist: starting 64 goroutines
	// under -race on a busy machine takes a while of its own.
	begin := make(chan struct{})
	for w := range workers {
		wg.Go(func() {
			<-begin
			for i := 0; time.Now().Before(end) || (!exercised() && time.Now().Before(giveUp)); i++ {
				d := time.Duration(2+(w*7+i*3)%19) * time.Millisecond * scale()
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
				// After its deadline a caller waits for its turn to run
				// at least twice: woken by its context, and again for the
				// store's queue lock (queued) or the pool (in flight), each
				// time behind up to 63 other callers whose deadlines
				// expired in the same stall. The measured lateness counts
				// once per wait.
				if took > d+redistest.Slack {
					if lateness := late.Max(); took > d+redistest.Slack+2*lateness {
						t.Errorf("update with a %v deadline returned after %v (slack %v, twice the scheduling lateness %v): %v", d, took, redistest.Slack, lateness, err)
					}
				}
			}
		})
	}
	start = time.Now()
	end, giveUp = start.Add(time.Second), start.Add(30*time.Second)
	close(begin)
	wg.Wait()
	proxy.Heal()
	// Let pipelines whose callers left reach Redis before reading.
	time.Sleep(100 * time.Millisecond)
	res := peekPatiently(t, ds, r)
	taken := (r.Burst - res.Remaining + 1<<30 - 1) >> 30
	t.Logf("%d admitted, %d failed (%d at their deadline), %d taken in Redis; %d commands, %d in pipelines",
		admitted.Load(), failed.Load(), timedOut.Load(), taken, counter.N.Load(), counter.Pipelined.Load())
	if admitted.Load() < 100 || timedOut.Load() == 0 || counter.Pipelined.Load() == 0 {
		t.Fatal("the run did not exercise admissions, deadlines and pipelines together")
	}
	if taken < admitted.Load() || taken > admitted.Load()+failed.Load() {
		t.Fatalf("Redis took %d, want between the %d admitted and %d (admitted plus failed)", taken, admitted.Load(), admitted.Load()+failed.Load())
	}
}
