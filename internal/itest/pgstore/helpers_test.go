// Package pgstore_test holds the tests of the PostgreSQL store that need a
// fault-injecting proxy: the store's behaviour when connections fail or go
// silent, with decisions made by the engine behind pgstore.Store.
package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratekit/ratekit/internal/pgengine"
	"github.com/ratekit/ratekit/internal/pgtest"
	"github.com/ratekit/ratekit/pgstore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func newStore(t testing.TB, db pgstore.DB) *pgstore.Store {
	t.Helper()
	s, err := pgstore.New(db, pgstore.Config{Schema: pgtest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newCounter returns a counter of s's engine for cfg, with a fresh prefix, a
// window of a day and no inline cleanup unless cfg says otherwise.
func newCounter(t testing.TB, s *pgstore.Store, cfg pgengine.CounterConfig) *pgengine.Counter {
	t.Helper()
	if cfg.Prefix == "" {
		cfg.Prefix = pgtest.Prefix(t)
	}
	if cfg.Window == 0 {
		cfg.Window = 24 * time.Hour
	}
	if cfg.CleanupProbability == 0 {
		cfg.CleanupProbability = -1
	}
	c, err := pgengine.From(s).Counter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
