package durable_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable/internal/pgengine"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
)

// TestPlannedBatchedExact runs 16 goroutines on one key of a Planned
// through a store that coalesces (a hot key: its decisions go in batches),
// while the key's plan changes between tiers, with refunds of admitted
// charges and retried idempotent charges mid-run. The monthly count read
// back must be exactly the units admitted less those refunded, each
// idempotent charge counted once, and never above the largest quota; and
// batches must have formed.
func TestPlannedBatchedExact(t *testing.T) {
	at := utc(2027, time.September, 9, 12, 0)
	tr := &pgstoretest.BatchCounter{}
	s, err := pgstore.New(pgstoretest.TracedPool(t, pgstoretest.PostgresURL(t), 8, tr), pgstore.Config{Schema: pgstoretest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	(*pgengine.Store)(s).SetPeriodClock(func() time.Time { return at }, time.Since(at))
	anchor := utc(2026, time.May, 9, 0, 0)
	tiers := []ratekit.Plan{tier("pro", 1000, 300, anchor), tier("team", 1000, 400, anchor), tier("free", 1000, 120, anchor)}
	pl := &planner{plans: map[string]ratekit.Plan{"hot": tiers[0]}}
	p := newPlanned(t, s, pgstoretest.Prefix(t), pl)
	ctx := ctxT(t)
	var admitted, refunded atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				if g == 0 && i%10 == 9 {
					pl.set("hot", tiers[(i/10)%len(tiers)])
				}
				cost := int64(1 + (g+i)%3)
				req := ratekit.Request{Key: "hot", Cost: cost}
				if i%7 == 3 {
					req.IdempotencyKey = fmt.Sprintf("charge-%d-%d", g, i)
				}
				d, err := p.Allow(ctx, req)
				if err != nil {
					t.Error(err)
					return
				}
				charged := d.Allowed
				if req.IdempotencyKey != "" {
					// A retry counts once: it is admitted again without
					// taking when the first attempt was admitted.
					r, err := p.Allow(ctx, req)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed && !r.Allowed {
						t.Errorf("retry of an admitted charge denied: %+v", r)
					}
					charged = charged || r.Allowed
				}
				if !charged {
					continue
				}
				admitted.Add(cost)
				if i%5 == 0 {
					if _, err := p.Refund(ctx, ratekit.Request{Key: "hot", Cost: cost}); err != nil {
						t.Error(err)
						return
					}
					refunded.Add(cost)
				}
			}
		}()
	}
	wg.Wait()
	u := usage(t, p, "hot")
	want := admitted.Load() - refunded.Load()
	if u[1].Used != want || want > 400 {
		t.Fatalf("monthly used %d; admitted %d, refunded %d: want %d, at most 400", u[1].Used, admitted.Load(), refunded.Load(), want)
	}
	if tr.Batches.Load() == 0 {
		t.Fatalf("no batch formed in %d statements", tr.Statements.Load())
	}
	t.Logf("admitted %d, refunded %d; %d statements, %d batches", admitted.Load(), refunded.Load(), tr.Statements.Load(), tr.Batches.Load())
}
