package chaostest_test

import (
	"context"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
)

// TestCoalescedFaults runs the fault matrix (latency, resets, outage) on a
// PostgreSQL store that keeps one decision in flight, with 16 callers at
// once, so that decisions go in batches before, during and after the
// fault. Every caller returns within its deadline and the margin, the store
// recovers, and it counts no unit that was not a successful decision or a
// failed attempt that may have reached it.
func TestCoalescedFaults(t *testing.T) {
	const callers = 16
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			u, err := url.Parse(pgstoretest.PostgresURL(t))
			if err != nil {
				t.Fatal(err)
			}
			p := newProxy(t, u.Host)
			u.Host = p.Listen
			tr := &pgstoretest.BatchCounter{}
			store, err := pgstore.New(pgstoretest.TracedPool(t, u.String(), 8, tr), pgstore.Config{Schema: pgstoretest.Schema(), MaxInFlight: 1})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := store.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			l, err := durable.New(durable.Config{Store: store,
				Policy: ratekit.Policy{Name: "chaos", Quota: 100000, Window: farWindow, Algorithm: ratekit.FixedWindow}, Prefix: pgstoretest.Prefix(t), Durability: durable.Unlogged})
			if err != nil {
				t.Fatal(err)
			}
			var successes, failures atomic.Int64
			wave := func(phase string, late func(time.Duration) bool) {
				var wg sync.WaitGroup
				for range callers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						ctx, cancel := context.WithTimeout(context.Background(), deadline)
						defer cancel()
						start := time.Now()
						d, err := l.Allow(ctx, req)
						if took := time.Since(start); late(took) {
							t.Errorf("%s: a decision returned after %v; deadline %v + margin %v", phase, took, deadline, margin)
						}
						if err == nil && d.Allowed {
							successes.Add(1)
						} else {
							failures.Add(1)
						}
					}()
				}
				wg.Wait()
			}
			onTime := func(took time.Duration) bool { return took > deadline+margin }
			// Before the fault: batches form. A loaded machine may need
			// a few waves.
			for i := 0; i < 20 && tr.Batches.Load() == 0; i++ {
				wave("before", func(time.Duration) bool { return false })
			}
			if tr.Batches.Load() == 0 {
				t.Fatal("no batch formed before the fault")
			}
			before := successes.Load()
			f.inject(t, p)
			wave("during", onTime)
			wave("during", onTime)
			duringFailures := failures.Load()
			if successes.Load() != before {
				t.Errorf("%d decisions succeeded during the fault", successes.Load()-before)
			}
			f.heal(t, p)
			recovered := false
			for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && !recovered; {
				s0 := successes.Load()
				wave("after", func(time.Duration) bool { return false })
				recovered = successes.Load()-s0 == callers
				if !recovered {
					time.Sleep(50 * time.Millisecond)
				}
			}
			if !recovered {
				t.Fatal("a wave of decisions did not all succeed within 5 s after the fault healed")
			}
			if f.name == "latency" {
				time.Sleep(2 * time.Second) // let the delayed replies drain
			}
			pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer pcancel()
			d, err := l.Peek(pctx, req)
			if err != nil {
				t.Fatal(err)
			}
			n := 100000 - d.Remaining
			most := successes.Load() + failures.Load()
			if !f.reaches {
				// Nothing sent during an outage reaches the store.
				most -= 2 * callers
			}
			if n < successes.Load() || n > most {
				t.Fatalf("the store counted %d units; %d decisions succeeded, %d failed (%d during the fault)",
					n, successes.Load(), failures.Load(), duringFailures)
			}
			t.Logf("%d statements, %d batches; %d succeeded, %d failed, %d counted", tr.Statements.Load(), tr.Batches.Load(), successes.Load(), failures.Load(), n)
		})
	}
}
