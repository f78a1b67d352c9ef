// Package failover_test fails a PostgreSQL primary over to a streaming
// standby under durable Logged decisions, as docs/postgres.md describes:
// with synchronous replication nothing admitted is lost; with asynchronous
// replication what the standby had not received is lost, and the test
// measures it.
package failover_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
)

// The workload: clients × goroutines decide on keys of quota units each.
// A client is a pool, a Store and a Limiter of its own, as a process (a
// function instance) has; the clients share this test's process.
const (
	clients    = 4
	goroutines = 16
	perRoutine = 24 // requests per goroutine, each retried until it has an answer
	quota      = 250
	killAt     = 100 // admitted units (all keys) at which the primary is stopped
	// attemptTime outlasts the stop of a standby cut off: a decision
	// cancelled while it waits for a synchronous standby is committed on
	// the primary alone (PostgreSQL cancels the wait, not the commit).
	attemptTime = 30 * time.Second
	requestTime = 180 * time.Second // the longest a request may stay unanswered
	retryPause  = 250 * time.Millisecond
	// lag is how long the standby is cut off before the primary stops, in
	// the runs that cut it off.
	lag = time.Second
	// Window is long enough that no run crosses a window boundary.
	window = 1000 * 24 * time.Hour
)

var keys = []string{"k0", "k1", "k2", "k3"}

func TestFailoverSynchronous(t *testing.T) {
	t.Run("streaming", func(t *testing.T) { checkSynchronous(t, runFailover(t, true, 0)) })
	t.Run("standby cut off", func(t *testing.T) { checkSynchronous(t, runFailover(t, true, lag)) })
}

// checkSynchronous checks that nothing admitted was lost at the failover.
func checkSynchronous(t *testing.T, r result) {
	for i, k := range keys {
		if r.seen[i] > quota {
			t.Errorf("key %s: clients saw %d units admitted across the failover, above the quota %d", k, r.seen[i], quota)
		}
		if r.used[i] != r.seen[i] {
			t.Errorf("key %s: the promoted standby counts %d units used, clients saw %d admitted", k, r.used[i], r.seen[i])
		}
	}
}

func TestFailoverAsynchronous(t *testing.T) {
	t.Run("streaming", func(t *testing.T) { checkAsynchronous(t, runFailover(t, false, 0)) })
	t.Run("standby cut off", func(t *testing.T) { checkAsynchronous(t, runFailover(t, false, lag)) })
}

// checkAsynchronous checks the bounds that hold whatever the standby lacks.
func checkAsynchronous(t *testing.T, r result) {
	for i, k := range keys {
		// What the promoted standby lacks comes back as quota: clients can
		// see up to the quota admitted before the stop and the quota again
		// after it, never more. The standby itself never counts more than
		// the quota, nor more than clients saw.
		if r.seen[i] > 2*quota {
			t.Errorf("key %s: clients saw %d units admitted, above twice the quota %d", k, r.seen[i], quota)
		}
		if r.used[i] > quota || r.used[i] > r.seen[i] {
			t.Errorf("key %s: the promoted standby counts %d units used; quota %d, clients saw %d admitted", k, r.used[i], quota, r.seen[i])
		}
	}
}

// result is what one failover run measured, per key (in the order of keys)
// and in time.
type result struct {
	seen []int64 // units clients saw admitted
	used []int64 // units the promoted standby counts as used
}

// runFailover runs the workload on a fresh primary and standby, stops the
// primary hard once killAt units are admitted (after cutting the standby
// off for cut when cut is positive), promotes the standby, lets
// every request be retried (same idempotency key) until it has an answer,
// and reads the counts back from the new primary.
func runFailover(t *testing.T, syncRep bool, cut time.Duration) result {
	start := time.Now()
	p := newPair(t, syncRep)
	setup := time.Since(start)

	limiters := make([]limiter, clients)
	for c := range limiters {
		limiters[c] = newLimiter(t, p.multiHostURL())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	if err := limiters[0].store.Migrate(ctx); err != nil {
		cancel()
		t.Fatalf("migrate on the primary: %v", err)
	}
	cancel()
	p.waitReplayed()

	var (
		admitted atomic.Int64
		pace     paceSetter
		mu       sync.Mutex
		seen     = make([]int64, len(keys))
		failures int
		first    time.Time     // first failed attempt
		last     time.Time     // last failed attempt
		longest  time.Duration // the longest a request waited for its answer, retries included
		attempts []attempt
		wg       sync.WaitGroup
	)
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	var (
		stopBegan   time.Time
		atStopBegan int64
	)
	// The stopper reports on killed when the primary is stopped, or the
	// error that kept it from stopping it; it closes stopperDone on its
	// way out.
	type stopped struct {
		at  time.Time
		err error
	}
	killed := make(chan stopped, 1)
	stopperDone := make(chan struct{})
	go func() {
		defer close(stopperDone)
		// The stop comes while decisions are in flight, at a pace that
		// leaves the quota seconds to outlast a slow pg_ctl.
		for admitted.Load() < killAt && runCtx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		if runCtx.Err() != nil {
			return
		}
		if cut > 0 {
			if err := p.cutStandby(); err != nil {
				killed <- stopped{err: err}
				return
			}
			time.Sleep(cut)
		}
		stopBegan, atStopBegan = time.Now(), admitted.Load()
		err := p.killPrimary()
		killed <- stopped{at: time.Now(), err: err}
	}()

	answer := func(l *durable.Limiter, req ratekit.Request) (ratekit.Decision, bool) {
		began := time.Now()
		defer func() {
			mu.Lock()
			longest = max(longest, time.Since(began))
			mu.Unlock()
		}()
		deadline := began.Add(requestTime)
		for time.Now().Before(deadline) && runCtx.Err() == nil {
			actx, cancel := context.WithTimeout(runCtx, attemptTime)
			at := attempt{began: time.Now()}
			d, err := l.Allow(actx, req)
			cancel()
			at.ended, at.ok = time.Now(), err == nil
			mu.Lock()
			attempts = append(attempts, at)
			mu.Unlock()
			if err == nil {
				return d, true
			}
			now := time.Now()
			mu.Lock()
			failures++
			if first.IsZero() {
				first = now
			}
			last = now
			mu.Unlock()
			time.Sleep(retryPause)
		}
		return ratekit.Decision{}, false
	}
	pace.set(150)
	var unanswered atomic.Int64
	for c := 0; c < clients; c++ {
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Goroutines start staggered, so that requests keep
				// going out at every moment of the run.
				n := time.Duration(c*goroutines + g)
				time.Sleep(n * pace.interval() / (clients * goroutines))
				for i := 0; i < perRoutine; i++ {
					if i > 0 {
						time.Sleep(pace.interval())
					}
					if runCtx.Err() != nil {
						return
					}
					k := (c*goroutines + g + i) % len(keys)
					req := ratekit.Request{Key: keys[k], Cost: 1, IdempotencyKey: fmt.Sprintf("c%d-g%d-r%d", c, g, i)}
					d, ok := answer(limiters[c].Limiter, req)
					if !ok {
						unanswered.Add(1)
						return
					}
					if d.Allowed {
						admitted.Add(1)
						mu.Lock()
						seen[k]++
						mu.Unlock()
					}
				}
			}()
		}
	}

	var killTime, promoted time.Time
	var atKill int64
	select {
	case s := <-killed:
		if s.err != nil {
			stop()
			wg.Wait()
			t.Fatalf("failover: %v\n%s", s.err, p.logs())
		}
		killTime = s.at
		atKill = admitted.Load()
		p.promote()
		promoted = time.Now()
		pace.set(400)
	case <-time.After(3 * time.Minute):
		stop()
		wg.Wait()
		<-stopperDone
		t.Fatalf("failover: %d units admitted in 3 minutes, the primary was never stopped\n%s", admitted.Load(), p.logs())
	}
	wg.Wait()
	if n := unanswered.Load(); n > 0 {
		t.Fatalf("failover: %d requests had no answer within %v of retries\n%s", n, requestTime, p.logs())
	}

	// Read the counts back from the new primary, through a client that
	// never saw the old one.
	check := newLimiter(t, p.multiHostURL())
	used := make([]int64, len(keys))
	for i, k := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		d, err := check.Peek(ctx, ratekit.Request{Key: k, Cost: 1})
		cancel()
		if err != nil {
			t.Fatalf("peek %s on the promoted standby: %v", k, err)
		}
		used[i] = quota - d.Remaining
	}

	var during, duringOK int
	for _, a := range attempts {
		if !a.began.Before(stopBegan) && a.began.Before(promoted) {
			during++
			if a.ok {
				duringOK++
			}
		}
	}
	mode := "asynchronous replication"
	if syncRep {
		mode = "synchronous replication"
	}
	var total int64
	for _, n := range seen {
		total += n
	}
	if cut > 0 {
		mode += fmt.Sprintf(", standby cut off %v before the stop", cut)
	}
	t.Logf("%s, %d clients × %d goroutines, %d requests on %d keys of quota %d: "+
		"admitted seen by clients %v (total %d), used on the promoted standby %v; "+
		"%d units admitted when the stop began, %d when it ended; "+
		"stop took %v, promotion %v; %d failed attempts from %v to %v after the stop began (window %v); "+
		"longest wait for an answer %v; %d attempts began while pg_ctl stopped and promoted, %d of them succeeded; "+
		"setup %v, run %v",
		mode, clients, goroutines, clients*goroutines*perRoutine, len(keys), quota,
		seen, total, used, atStopBegan, atKill,
		killTime.Sub(stopBegan).Round(time.Millisecond), promoted.Sub(killTime).Round(time.Millisecond), failures,
		since(first, stopBegan), since(last, stopBegan), last.Sub(first).Round(time.Millisecond),
		longest.Round(time.Millisecond), during, duringOK,
		setup.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if atKill >= int64(quota*len(keys)) {
		t.Errorf("failover: the quota (%d) was used up before the primary stopped (%d admitted): the run did not cross the failover", quota*len(keys), atKill)
	}
	// Loose bounds, for a loaded machine: decisions recover within a
	// minute and a half of the stop.
	if failures > 0 && last.Sub(stopBegan) > 90*time.Second {
		t.Errorf("failover: decisions still failed %v after the stop began, above 90s", last.Sub(stopBegan))
	}
	if longest > 90*time.Second {
		t.Errorf("failover: a request waited %v for its answer, above 90s", longest)
	}
	return result{seen: seen, used: used}
}

// paceSetter paces the run's requests: each goroutine waits interval
// between its requests, so that all of them together send about the rate
// set (fewer when decisions are slow). It is safe for concurrent use.
type paceSetter struct{ ns atomic.Int64 }

// set makes the rate perSecond requests a second over all goroutines.
func (p *paceSetter) set(perSecond int) {
	p.ns.Store(int64(time.Second) * clients * goroutines / int64(perSecond))
}

func (p *paceSetter) interval() time.Duration { return time.Duration(p.ns.Load()) }

// attempt is one call of Allow: when it began and ended, and whether it
// returned a decision.
type attempt struct {
	began, ended time.Time
	ok           bool
}

func since(t, ref time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return t.Sub(ref).Round(time.Millisecond)
}

// limiter is a Limiter with the Store it runs on.
type limiter struct {
	*durable.Limiter
	store *pgstore.Store
}

// newLimiter returns a client of its own on url: a pool configured for
// serverless functions, a Store and a Logged fixed-window limiter with
// synchronous commit (the settings for a billing quota), all on the keys
// every client of the run shares.
func newLimiter(t *testing.T, url string) limiter {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, pgstore.ServerlessPoolConfig(cfg, attemptTime))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := durable.New(durable.Config{
		Store:              s,
		Policy:             ratekit.Policy{Name: "failover", Quota: quota, Window: window, Algorithm: ratekit.FixedWindow},
		Durability:         durable.Logged,
		SynchronousCommit:  true,
		CleanupProbability: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	return limiter{Limiter: l, store: s}
}
