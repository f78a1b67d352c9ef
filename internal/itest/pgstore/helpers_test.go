package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
)

func TestMain(m *testing.M) { pgstoretest.Main(m) }

func newStore(t testing.TB, db pgstore.DB) *pgstore.Store {
	t.Helper()
	s, err := pgstore.New(db, pgstore.Config{Schema: pgstoretest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// counter is a durable limiter of one algorithm and a quota per 1000
// days (a fixed window that no test runs across: windows are aligned to
// the epoch), on a prefix of the test's own, with inline cleanup off.
type counter struct {
	l   *durable.Limiter
	cfg durable.Config
	t   testing.TB
}

func newCounter(t testing.TB, s *pgstore.Store, alg ratekit.Algorithm, quota int64) counter {
	t.Helper()
	return counter{cfg: durable.Config{
		Policy:             ratekit.Policy{Name: "far", Quota: quota, Window: 1000 * 24 * time.Hour, Algorithm: alg},
		Prefix:             pgstoretest.Prefix(t),
		CleanupProbability: -1, Durability: durable.Unlogged,
	}, t: t}.on(s)
}

// on returns the same counter (the same keys) on store s.
func (c counter) on(s *pgstore.Store) counter {
	c.t.Helper()
	c.cfg.Store = s
	l, err := durable.New(c.cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.l = l
	return c
}

// Take asks for cost units of key, as one attempt with idempotency key idem
// (empty for none).
func (c counter) Take(ctx context.Context, key string, cost int64, idem string) (ratekit.Decision, error) {
	return c.l.Allow(ctx, ratekit.Request{Key: key, Cost: cost, IdempotencyKey: idem})
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
