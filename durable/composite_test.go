package durable_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
)

// farWindow is long enough that no epoch-aligned window boundary falls
// inside a test.
const farWindow = 10000 * time.Hour

func newLimiter(t testing.TB, s *pgstore.Store, alg ratekit.Algorithm, name, prefix string, quota int64, window time.Duration) *durable.Limiter {
	t.Helper()
	l, err := durable.New(durable.Config{Store: s, Policy: ratekit.Policy{Name: name, Quota: quota, Window: window, Algorithm: alg}, Prefix: prefix, Durability: durable.Logged})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func newComposite(t testing.TB, ls ...*durable.Limiter) *durable.Composite {
	t.Helper()
	c, err := durable.NewComposite(ls...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func remaining(t testing.TB, l ratekit.Peeker, key string) int64 {
	t.Helper()
	d, err := l.Peek(ctxT(t), ratekit.Request{Key: key, Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

// TestCompositeContract runs a composite of each algorithm (small quota)
// with a fixed window (larger quota) on one key: the small policy binds, a
// denial takes nothing from the other, Peek, Refund and Reset act on both.
func TestCompositeContract(t *testing.T) {
	s := newStore(t, pgstoretest.PostgresURL(t), 4)
	ctx := ctxT(t)
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			p := pgstoretest.Prefix(t)
			small := newLimiter(t, s, alg, "burst", p+"-b", 3, farWindow)
			large := newLimiter(t, s, ratekit.FixedWindow, "long", p+"-l", 5, farWindow)
			c := newComposite(t, small, large)
			req := ratekit.Request{Key: "customer-7", Cost: 1}
			for i := int64(0); i < 3; i++ {
				d, err := c.Allow(ctx, req)
				if err != nil || !d.Allowed || len(d.Parts) != 2 || d.Parts[0].Remaining != 2-i || d.Parts[1].Remaining != 4-i ||
					d.Remaining != 2-i || d.Policy != small.Policy() || d.Quota != 3 || d.RetryAfter != 0 {
					t.Fatalf("allow %d: %+v, %v", i, d, err)
				}
			}
			d, err := c.Allow(ctx, req)
			if err != nil || d.Allowed || d.Parts[0].Allowed || !d.Parts[1].Allowed || d.RetryAfter <= 0 ||
				d.RetryAfter != d.Parts[0].RetryAfter || d.Parts[1].RetryAfter != 0 || d.Policy != small.Policy() || d.Parts[1].Remaining != 2 {
				t.Fatalf("over the small quota: %+v, %v", d, err)
			}
			if got := remaining(t, large, req.Key); got != 2 {
				t.Fatalf("the denial took from the large policy: remaining %d, want 2", got)
			}
			if d, err := c.Peek(ctx, req); err != nil || d.Allowed || d.Parts[0].Remaining != 0 || d.Parts[1].Remaining != 2 {
				t.Fatalf("peek: %+v, %v", d, err)
			}
			if d, err := c.Refund(ctx, ratekit.Request{Key: req.Key, Cost: 2}); err != nil || !d.Allowed || d.Parts[0].Remaining != 2 || d.Parts[1].Remaining != 4 {
				t.Fatalf("refund: %+v, %v", d, err)
			}
			// The large policy binds when its part costs more.
			d, err = c.Allow(ctx, ratekit.Request{Key: req.Key, Cost: 1, Parts: []ratekit.Part{{Key: req.Key, Cost: 1}, {Key: req.Key, Cost: 5}}})
			if err != nil || d.Allowed || !d.Parts[0].Allowed || d.Parts[1].Allowed || d.Policy != large.Policy() {
				t.Fatalf("over the large quota: %+v, %v", d, err)
			}
			if got := remaining(t, small, req.Key); got != 2 {
				t.Fatalf("the denial took from the small policy: remaining %d, want 2", got)
			}
			if err := c.Reset(ctx, req.Key); err != nil {
				t.Fatal(err)
			}
			if a, b := remaining(t, small, req.Key), remaining(t, large, req.Key); a != 3 || b != 5 {
				t.Fatalf("after reset: remaining %d and %d, want 3 and 5", a, b)
			}
		})
	}
}

// TestCompositeValidation: bad requests are refused before the database.
func TestCompositeValidation(t *testing.T) {
	s := newStore(t, pgstoretest.PostgresURL(t), 2)
	ctx := ctxT(t)
	p := pgstoretest.Prefix(t)
	a := newLimiter(t, s, ratekit.FixedWindow, "a", p+"-a", 3, farWindow)
	b := newLimiter(t, s, ratekit.TokenBucket, "b", p+"-b", 5, farWindow)
	c := newComposite(t, a, b)
	for _, tc := range []struct {
		req  ratekit.Request
		want error
	}{
		{ratekit.Request{Key: "k", Cost: 1, Parts: []ratekit.Part{{Key: "k", Cost: 1}}}, ratekit.ErrInvalidRequest},
		{ratekit.Request{Key: "k", Cost: 1, Parts: []ratekit.Part{{Key: "k", Cost: 1}, {Key: "k", Cost: 1}, {Key: "k", Cost: 1}}}, ratekit.ErrInvalidRequest},
		{ratekit.Request{Key: "k", Cost: 1, Parts: []ratekit.Part{{Key: "k", Cost: 4}, {Key: "k", Cost: 1}}}, ratekit.ErrCostExceedsQuota},
		{ratekit.Request{Key: "k", Cost: 4}, ratekit.ErrCostExceedsQuota},
		{ratekit.Request{Key: "k", Cost: 1, Parts: []ratekit.Part{{Key: "", Cost: 1}, {Key: "k", Cost: 1}}}, ratekit.ErrEmptyKey},
		{ratekit.Request{Key: "k", Cost: 1, Parts: []ratekit.Part{{Key: "k", Cost: 1}, {Key: "k", Cost: 0}}}, ratekit.ErrInvalidCost},
		{ratekit.Request{Key: "", Cost: 1}, ratekit.ErrEmptyKey},
	} {
		if _, err := c.Allow(ctx, tc.req); !errors.Is(err, tc.want) || !errors.Is(err, ratekit.ErrInvalidRequest) {
			t.Errorf("Allow(%+v) = %v, want %v", tc.req, err, tc.want)
		}
		if _, err := c.Peek(ctx, tc.req); !errors.Is(err, tc.want) {
			t.Errorf("Peek(%+v) = %v, want %v", tc.req, err, tc.want)
		}
	}
	unlogged, err := durable.New(durable.Config{Store: s, Policy: ratekit.Policy{Name: "u", Quota: 1, Window: farWindow, Algorithm: ratekit.FixedWindow}, Prefix: p + "-u", Durability: durable.Unlogged})
	if err != nil {
		t.Fatal(err)
	}
	other := newStore(t, pgstoretest.PostgresURL(t), 1)
	elsewhere := newLimiter(t, other, ratekit.FixedWindow, "e", p+"-e", 1, farWindow)
	many := make([]*durable.Limiter, 17)
	for i := range many {
		many[i] = newLimiter(t, s, ratekit.FixedWindow, "m", fmt.Sprintf("%s-m%d", p, i), 1, farWindow)
	}
	for name, ls := range map[string][]*durable.Limiter{
		"none": nil, "nil": {a, nil}, "same prefix": {a, a}, "mixed durability": {a, unlogged},
		"two stores": {a, elsewhere}, "seventeen": many,
	} {
		if _, err := durable.NewComposite(ls...); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("NewComposite(%s) = %v, want ErrInvalidConfig", name, err)
		}
	}
}

// TestCompositeSimpleProtocol: the composite's array arguments also pass
// through pgx's simple protocol (for poolers that refuse the extended one),
// keys with any bytes but NUL included.
func TestCompositeSimpleProtocol(t *testing.T) {
	s, err := pgstore.New(pgstoretest.Pool(t, pgstoretest.PgBouncerURL(t), 2, ""), pgstore.Config{Schema: pgstoretest.Schema(), SimpleProtocol: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	p := pgstoretest.Prefix(t)
	c := newComposite(t,
		newLimiter(t, s, ratekit.SlidingWindow, "a", p+"-a", 2, farWindow),
		newLimiter(t, s, ratekit.SlidingLog, "b", p+"-b", 3, farWindow))
	key := "k,\"}{\\ \xff'"
	for i := int64(0); i < 3; i++ {
		d, err := c.Allow(ctx, ratekit.Request{Key: key, Cost: 1, Parts: []ratekit.Part{{Key: key, Cost: 1}, {Key: key + "'", Cost: 1}}})
		if err != nil || d.Allowed != (i < 2) || d.Parts[1].Remaining != 3-min(i+1, 2) {
			t.Fatalf("allow %d: %+v, %v", i, d, err)
		}
	}
}
