package durable_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/limitertest"
)

const (
	pools   = 4
	workers = 64
)

var servers = []struct {
	name string
	url  func(testing.TB) string
}{
	{"postgres", pgstoretest.PostgresURL},
	{"pgbouncer", pgstoretest.PgBouncerURL},
}

// storedCount reads the count column of (prefix, key) in the logged counters
// table, 0 when there is no row.
func storedCount(t testing.TB, prefix, key string) int64 {
	t.Helper()
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 1, "")
	var n int64
	err := pool.QueryRow(ctxT(t), `SELECT COALESCE((SELECT count FROM "`+pgstoretest.Schema()+`".counters WHERE prefix = $1 AND key = $2), 0)`, prefix, []byte(key)).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// burst runs pools × workers goroutines, each with its own composite over
// a pool of its own, sending perWorker requests of parts; it returns the
// admissions and fails the test on any error.
func burst(t *testing.T, cs []*durable.Composite, perWorker int, req func(w int) ratekit.Request) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, len(cs)*workers)
	for p := range cs {
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(c *durable.Composite, w int) {
				defer wg.Done()
				for i := 0; i < perWorker; i++ {
					d, err := c.Allow(ctx, req(w))
					if err != nil {
						errs <- err
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			}(cs[p], p*workers+w)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return admitted.Load()
}

// compositesOnPools returns one composite per pool over the same policies.
func compositesOnPools(t *testing.T, url string, mk func(s *pgstore.Store) []*durable.Limiter) []*durable.Composite {
	cs := make([]*durable.Composite, pools)
	for i := range cs {
		s, err := pgstore.New(pgstoretest.Pool(t, url, 8, fmt.Sprintf("composite-%d", i)), pgstore.Config{Schema: pgstoretest.Schema()})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		cs[i] = newComposite(t, mk(s)...)
	}
	return cs
}

// TestCompositeExact: 4 pools × 64 goroutines over a per-user policy (40)
// and a per-organisation policy (100) sharing the organisation's key. With
// one user the user's policy binds at exactly 40; with a second user the
// organisation's binds at exactly 100. The stored counts show that no
// decision took from one policy without the other.
func TestCompositeExact(t *testing.T) {
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			url := srv.url(t)
			p := pgstoretest.Prefix(t)
			cs := compositesOnPools(t, url, func(s *pgstore.Store) []*durable.Limiter {
				return []*durable.Limiter{
					newLimiter(t, s, ratekit.FixedWindow, "user", p+"-user", 40, farWindow),
					newLimiter(t, s, ratekit.SlidingWindow, "org", p+"-org", 100, farWindow),
				}
			})
			parts := func(users ...string) func(int) ratekit.Request {
				return func(w int) ratekit.Request {
					user := users[w%len(users)]
					return ratekit.Request{Key: user, Cost: 1, Parts: []ratekit.Part{{Key: user, Cost: 1}, {Key: "org", Cost: 1}}}
				}
			}
			if n := burst(t, cs, 2, parts("alice")); n != 40 {
				t.Errorf("alice: %d admitted, want exactly the user quota 40", n)
			}
			// Bob and Carol could take 40 each; the organisation has 60 left.
			if n := burst(t, cs, 2, parts("bob", "carol")); n != 60 {
				t.Errorf("bob and carol: %d admitted, want the 60 left of the organisation's 100", n)
			}
			if got := storedCount(t, p+"-user", "alice"); got != 40 {
				t.Errorf("stored count of alice = %d, want 40", got)
			}
			if got := storedCount(t, p+"-org", "org"); got != 100 {
				t.Errorf("stored count of the organisation = %d, want 100", got)
			}
			bob, carol := storedCount(t, p+"-user", "bob"), storedCount(t, p+"-user", "carol")
			if bob+carol != 60 || bob > 40 || carol > 40 {
				t.Errorf("stored counts of bob and carol = %d and %d, want 60 in all and at most 40 each", bob, carol)
			}
		})
	}
}

// TestCompositeNoDeadlock runs two composites over the same two policies in
// opposite order (so their parts name the keys in opposite order) at once
// from 4 pools: sorted lock acquisition means PostgreSQL never reports a
// deadlock (40P01), and both policies count every admission.
func TestCompositeNoDeadlock(t *testing.T) {
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			url := srv.url(t)
			p := pgstoretest.Prefix(t)
			var fwd, rev []*durable.Composite
			for i := 0; i < pools; i++ {
				s, err := pgstore.New(pgstoretest.Pool(t, url, 8, ""), pgstore.Config{Schema: pgstoretest.Schema()})
				if err != nil {
					t.Fatal(err)
				}
				a := newLimiter(t, s, ratekit.FixedWindow, "a", p+"-a", 1<<40, farWindow)
				b := newLimiter(t, s, ratekit.TokenBucket, "b", p+"-b", 1<<30, farWindow)
				fwd = append(fwd, newComposite(t, a, b))
				rev = append(rev, newComposite(t, b, a))
			}
			const per = 10
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, 2*pools*workers)
			for i := 0; i < pools; i++ {
				for w := 0; w < workers; w++ {
					wg.Add(1)
					go func(c *durable.Composite, parts []ratekit.Part) {
						defer wg.Done()
						for j := 0; j < per; j++ {
							d, err := c.Allow(ctx, ratekit.Request{Key: "k", Cost: 1, Parts: parts})
							if err == nil && !d.Allowed {
								err = fmt.Errorf("denied: %+v", d)
							}
							if err != nil {
								errs <- err
								return
							}
						}
					}(map[bool]*durable.Composite{true: fwd[i], false: rev[i]}[w%2 == 0],
						map[bool][]ratekit.Part{true: {{Key: "k1", Cost: 1}, {Key: "k2", Cost: 1}}, false: {{Key: "k2", Cost: 1}, {Key: "k1", Cost: 1}}}[w%2 == 0])
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if got := storedCount(t, p+"-a", "k1"); got != pools*workers*per {
				t.Errorf("policy a counted %d, want %d", got, pools*workers*per)
			}
		})
	}
}

// TestCompositeIdempotent: a retried Allow counts once for every policy, even
// when the retries race; a denied attempt is judged afresh; a refund with an
// idempotency key counts once, and a charge after it is taken again.
func TestCompositeIdempotent(t *testing.T) {
	url := pgstoretest.PostgresURL(t)
	s := newStore(t, url, 8)
	ctx := ctxT(t)
	p := pgstoretest.Prefix(t)
	a := newLimiter(t, s, ratekit.FixedWindow, "a", p+"-a", 3, farWindow)
	b := newLimiter(t, s, ratekit.SlidingLog, "b", p+"-b", 5, time.Hour)
	c := newComposite(t, a, b)
	req := ratekit.Request{Key: "k", Cost: 1, IdempotencyKey: "order-1"}
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := c.Allow(ctx, req)
			if err != nil {
				t.Error(err)
				return
			}
			if d.Allowed {
				admitted.Add(1)
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != workers {
		t.Fatalf("%d of %d retries admitted, want all (the first attempt was)", admitted.Load(), workers)
	}
	if ra, rb := remaining(t, a, "k"), remaining(t, b, "k"); ra != 2 || rb != 4 {
		t.Fatalf("after %d retries: remaining %d and %d, want 2 and 4 (counted once)", workers, ra, rb)
	}
	// The same idempotency key under a single limiter is another record.
	if d, err := a.Allow(ctx, req); err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("single limiter with the same idempotency key: %+v, %v", d, err)
	}
	// Denied: the large part costs more than b has; the retry is judged
	// afresh (and denied again), then admitted with a smaller cost.
	big := ratekit.Request{Key: "k", Cost: 1, IdempotencyKey: "order-2", Parts: []ratekit.Part{{Key: "k", Cost: 1}, {Key: "k", Cost: 5}}}
	for i := 0; i < 2; i++ {
		if d, err := c.Allow(ctx, big); err != nil || d.Allowed {
			t.Fatalf("big %d: %+v, %v", i, d, err)
		}
	}
	big.Parts[1].Cost = 1
	if d, err := c.Allow(ctx, big); err != nil || !d.Allowed || d.Parts[0].Remaining != 0 || d.Parts[1].Remaining != 3 {
		t.Fatalf("after denials: %+v, %v", d, err)
	}
	refund := ratekit.Request{Key: "k", Cost: 1, IdempotencyKey: "order-2"}
	for i := 0; i < 3; i++ {
		if d, err := c.Refund(ctx, refund); err != nil || d.Parts[0].Remaining != 1 || d.Parts[1].Remaining != 4 {
			t.Fatalf("refund %d: %+v, %v", i, d, err)
		}
	}
	// A charge after the refund is taken again.
	if d, err := c.Allow(ctx, big); err != nil || !d.Allowed || d.Parts[0].Remaining != 0 || d.Parts[1].Remaining != 3 {
		t.Fatalf("charge after refund: %+v, %v", d, err)
	}
	if err := c.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if d, err := c.Allow(ctx, req); err != nil || !d.Allowed || d.Parts[0].Remaining != 2 {
		t.Fatalf("after reset the record is gone: %+v, %v", d, err)
	}
}

// TestCompositeHistory checks each policy's history on its own: 32
// goroutines send composite requests over a fixed window (5 per 400 ms) and
// a token bucket (8 per second) for 2 s in real time, through PostgreSQL and
// PgBouncer; each policy's admissions must keep that policy's bound.
func TestCompositeHistory(t *testing.T) {
	const skew = 2 * time.Millisecond
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			s, err := pgstore.New(pgstoretest.Pool(t, srv.url(t), 16, ""), pgstore.Config{Schema: pgstoretest.Schema()})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			p := pgstoretest.Prefix(t)
			a := newLimiter(t, s, ratekit.FixedWindow, "a", p+"-a", 5, 400*time.Millisecond)
			b := newLimiter(t, s, ratekit.TokenBucket, "b", p+"-b", 8, time.Second)
			c := newComposite(t, a, b)
			var mu sync.Mutex
			var opsA, opsB []limitertest.Op
			ctx := ctxT(t)
			deadline := time.Now().Add(2 * time.Second)
			var wg sync.WaitGroup
			for w := 0; w < 32; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					for i := 0; time.Now().Before(deadline); i++ {
						req := ratekit.Request{Key: "u", Cost: 1, Parts: []ratekit.Part{{Key: "u", Cost: 1}, {Key: "org", Cost: int64(1 + (w+i)%2)}}}
						start := time.Now()
						d, err := c.Allow(ctx, req)
						end := time.Now()
						out := limitertest.Denied
						switch {
						case err != nil:
							out = limitertest.Failed
						case d.Allowed:
							out = limitertest.Admitted
						}
						mu.Lock()
						opsA = append(opsA, limitertest.Op{Key: "u", Cost: 1, Outcome: out, Start: start, End: end})
						opsB = append(opsB, limitertest.Op{Key: "org", Cost: req.Parts[1].Cost, Outcome: out, Start: start, End: end})
						mu.Unlock()
						time.Sleep(5 * time.Millisecond)
					}
				}(w)
			}
			wg.Wait()
			admitted := 0
			for _, o := range opsA {
				if o.Outcome == limitertest.Admitted {
					admitted++
				}
			}
			if admitted == 0 {
				t.Fatalf("nothing admitted in %d decisions", len(opsA))
			}
			if err := limitertest.CheckOps(opsA, limitertest.FixedWindowBound(5, 400*time.Millisecond, skew)); err != nil {
				t.Errorf("policy a: %v", err)
			}
			if err := limitertest.CheckOps(opsB, limitertest.TokenBucketBound(8, 8, time.Second, skew)); err != nil {
				t.Errorf("policy b: %v", err)
			}
			t.Logf("%d decisions, %d admitted", len(opsA), admitted)
		})
	}
}
