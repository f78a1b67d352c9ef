package pgstore_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ratekit/ratekit/internal/pgtest"
	"github.com/ratekit/ratekit/pgstore"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := pgtest.DropSchema(); err != nil {
		fmt.Fprintln(os.Stderr, "drop test schema:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func newStore(t testing.TB, db pgstore.DB) *pgstore.Store {
	t.Helper()
	s, err := pgstore.New(db, pgstore.Config{Schema: pgtest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newCounter(t testing.TB, s *pgstore.Store, cfg pgstore.CounterConfig) *pgstore.Counter {
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
	c, err := s.Counter(cfg)
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
