package tokenbucket_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// Sentinel's timing in TestRedisSentinelFailover, and the bound on the
// outage derived from it.
const (
	failoverDownAfter = 500 * time.Millisecond
	failoverTimeout   = 3 * time.Second
	// failoverDecision is the deadline of each decision, the longest a
	// decision on a dead or paused master waits.
	failoverDecision = 250 * time.Millisecond
	// failoverOutage bounds the time from the master's failure to the
	// last failed decision: Sentinel sees it down down-after after its last
	// answer, and a ping may have just been answered (2 × down-after);
	// the promotion must be confirmed within failover-timeout or Sentinel
	// gives up; Sentinel's timer is randomised by up to 1s to desynchronise
	// Sentinels and polls the promoted replica's INFO every second while it
	// fails over (2s); a decision that started just before the switch runs
	// to its own deadline, and the client dials the new master on its next
	// command.
	failoverOutage = 2*failoverDownAfter + failoverTimeout + 2*time.Second + 2*failoverDecision
)

// TestRedisSentinelFailover fails the master of a live Sentinel deployment
// (one master, one replica, one Sentinel, on loopback) under Atomic decisions
// made through a go-redis failover client, on keys half used before the
// failure, and checks the guarantee the package documents:
//
//   - decisions fail only until the replica is promoted, within
//     failoverOutage of the failure (derived from Sentinel's timeouts), and
//     then succeed on the new master with no help;
//   - on each key in use at the switch, admissions on both sides of the
//     switch add up to at most 2 × Burst (refill is negligible here).
//
// "kill" kills the master (SIGKILL): what it acknowledged but had not yet
// replicated is lost, and the new master admits it again. "partition" stops
// it (SIGSTOP) and continues it after the promotion: until Sentinel demotes
// it, the old master still takes writes from clients on its side (here a
// client that still points at it), so both masters admit, each up to Burst
// from the state it holds; Redis never merges the two.
func TestRedisSentinelFailover(t *testing.T) {
	for _, fault := range []string{"kill", "partition"} {
		t.Run(fault, func(t *testing.T) { testSentinelFailover(t, fault) })
	}
}

func testSentinelFailover(t *testing.T, fault string) {
	const burst, keys, workers = 20, 6, 6
	d := redistest.StartSentinel(t, failoverDownAfter, failoverTimeout)
	client := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{
		Addrs:      []string{d.Sentinel.Addr},
		MasterName: d.MasterName,
	}, failoverDecision))
	t.Cleanup(func() { client.Close() })
	limiter := func(c redis.UniversalClient) *tokenbucket.Limiter {
		store, err := redisstore.New(c, redisstore.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return newLimiter(t, tokenbucket.Config{Name: "p", Burst: burst, RefillRate: tokenbucket.PerHour(1), Mode: tokenbucket.Atomic, Store: store})
	}
	l := limiter(client)
	key := func(k int) string { return "user:" + strconv.Itoa(k) }
	allow := func(l *tokenbucket.Limiter, k int) (ratekit.Decision, error) {
		ctx, cancel := context.WithTimeout(context.Background(), failoverDecision)
		defer cancel()
		return l.Allow(ctx, ratekit.Request{Key: key(k), Cost: 1})
	}

	// Half of every bucket is used before the failure, and replicated.
	var admitted [keys]atomic.Int64
	for k := range keys {
		for range burst / 2 {
			dec, err := allowPatiently(t, l, key(k))
			if !dec.Allowed {
				t.Fatalf("key %d before the failure: %+v, %v", k, dec, err)
			}
			admitted[k].Add(1)
		}
	}
	waitReplicated(t, d)

	// Workers decide on every key, round robin, one decision every 20ms
	// each, from before the master fails until every key was denied by a
	// decision that started after the new master served its first one.
	var (
		fail       atomic.Int64 // time of the failure, UnixNano; 0 before
		recovered  atomic.Int64 // start of the first successful decision after the failure, UnixNano; 0 before
		lastFailed atomic.Int64 // start of the latest failed decision, UnixNano
		failures   atomic.Int64
		denied     [keys]atomic.Bool
		done       = make(chan struct{})
		wg         sync.WaitGroup
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				time.Sleep(20 * time.Millisecond)
				k := i % keys
				began := time.Now()
				dec, err := allow(l, k)
				if fail.Load() == 0 {
					// Before the failure: count, nothing else.
					if err == nil && dec.Allowed {
						admitted[k].Add(1)
					}
					continue
				}
				if err != nil {
					failures.Add(1)
					for old := lastFailed.Load(); began.UnixNano() > old && !lastFailed.CompareAndSwap(old, began.UnixNano()); old = lastFailed.Load() {
					}
					continue
				}
				if began.UnixNano() > fail.Load() {
					recovered.CompareAndSwap(0, began.UnixNano())
				}
				if dec.Allowed {
					admitted[k].Add(1)
				} else if r := recovered.Load(); r != 0 && began.UnixNano() > r {
					denied[k].Store(true)
				}
			}
		}()
	}
	// The master fails while the workers run: about a third of the tokens
	// left are taken by then.
	time.Sleep(time.Duration(burst/2*keys/3/workers) * 20 * time.Millisecond)
	if fault == "kill" {
		d.Master.Stop()
	} else {
		d.Master.Pause()
	}
	fail.Store(time.Now().UnixNano())
	give := time.Now().Add(failoverOutage + 10*time.Second)
	for !allTrue(denied[:]) && time.Now().Before(give) {
		time.Sleep(10 * time.Millisecond)
	}
	close(done)
	wg.Wait()
	if recovered.Load() == 0 {
		t.Fatalf("%s: no decision succeeded within %v of the failure (%d failed)", fault, failoverOutage+10*time.Second, failures.Load())
	}
	outage := time.Duration(recovered.Load() - fail.Load())
	lastFail := time.Duration(0)
	if n := lastFailed.Load(); n != 0 {
		lastFail = time.Duration(n - fail.Load())
	}
	t.Logf("%s: first decision on the new master started %v after the failure; %d decisions failed, the last one started at %v; the bound is %v",
		fault, outage.Round(time.Millisecond), failures.Load(), lastFail.Round(time.Millisecond), failoverOutage)
	if outage > failoverOutage {
		t.Errorf("%s: the first decision on the new master started %v after the failure; the bound is %v", fault, outage, failoverOutage)
	}
	if lastFail > failoverOutage {
		t.Errorf("%s: a decision that started %v after the failure failed; decisions may fail for %v at most", fault, lastFail, failoverOutage)
	}
	if !allTrue(denied[:]) {
		t.Fatalf("%s: not every key was denied on the new master within %v", fault, failoverOutage+10*time.Second)
	}

	if fault == "partition" {
		// The old master comes back still a master; a client on its side
		// (one that still points at it) decides there until Sentinel demotes
		// it, on the state it held when it stopped.
		d.Master.Resume()
		stale := redis.NewClient(&redis.Options{Addr: d.Master.Addr, MaxRetries: -1})
		t.Cleanup(func() { stale.Close() })
		sl := limiter(stale)
		for k := range keys {
			for {
				dec, err := allow(sl, k)
				if err != nil || !dec.Allowed {
					break
				}
				admitted[k].Add(1)
			}
		}
	}

	var counts []string
	over := false
	for k := range keys {
		n := admitted[k].Load()
		counts = append(counts, fmt.Sprint(n))
		if n < burst || n > 2*burst {
			t.Errorf("%s: key %d admitted %d, want between Burst (%d) and the documented bound 2 × Burst (%d)", fault, k, n, burst, 2*burst)
		}
		over = over || n > burst
	}
	t.Logf("%s: admitted per key (Burst %d): %s", fault, burst, strings.Join(counts, " "))
	if fault == "partition" && !over {
		t.Errorf("%s: no key admitted more than Burst; the old master took no write after it came back, so the test did not exercise both masters", fault)
	}
}

// allowPatiently takes one token of key, retrying errors for up to 10s: the
// setup must not fail on a loaded machine.
func allowPatiently(t *testing.T, l *tokenbucket.Limiter, key string) (ratekit.Decision, error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var dec ratekit.Decision
		dec, err = l.Allow(ctx, ratekit.Request{Key: key, Cost: 1})
		cancel()
		if err == nil {
			return dec, nil
		}
	}
	t.Fatalf("Allow(%q) before the failure: %v", key, err)
	return ratekit.Decision{}, err
}

// waitReplicated waits until the replica has applied everything the master
// wrote.
func waitReplicated(t *testing.T, d *redistest.Sentinel) {
	t.Helper()
	ctx := context.Background()
	master := redis.NewClient(&redis.Options{Addr: d.Master.Addr})
	defer master.Close()
	replica := redis.NewClient(&redis.Options{Addr: d.Replica.Addr})
	defer replica.Close()
	offset := func(c *redis.Client, field string) int64 {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, field+":"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		t.Fatalf("no %s in INFO replication: %q", field, info)
		return 0
	}
	want := offset(master, "master_repl_offset")
	for deadline := time.Now().Add(10 * time.Second); offset(replica, "slave_repl_offset") < want; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the replica did not catch up with the master within 10s")
		}
	}
}

func allTrue(bs []atomic.Bool) bool {
	for i := range bs {
		if !bs[i].Load() {
			return false
		}
	}
	return true
}
