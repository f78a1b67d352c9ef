package pgengine_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable/internal/pgengine"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
)

// onePool returns a pool of one connection to url whose default query exec
// mode is mode.
func onePool(t *testing.T, url string, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.DefaultQueryExecMode = mode
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestQueryExecModes decides in every query exec mode of the pool (and in
// the simple protocol through Config.SimpleProtocol), single-key,
// composite and batched, and checks that a Store prepares its statements
// exactly when the pool's mode is pgx's default, cache_statement.
func TestQueryExecModes(t *testing.T) {
	url := pgstoretest.PostgresURL(t)
	ctx := ctxT(t)
	modes := []struct {
		name     string
		mode     pgx.QueryExecMode
		simple   bool
		prepares bool
	}{
		{"cache_statement", pgx.QueryExecModeCacheStatement, false, true},
		{"cache_describe", pgx.QueryExecModeCacheDescribe, false, false},
		{"describe_exec", pgx.QueryExecModeDescribeExec, false, false},
		{"exec", pgx.QueryExecModeExec, false, false},
		{"simple_protocol", pgx.QueryExecModeSimpleProtocol, false, false},
		{"cache_statement, SimpleProtocol set", pgx.QueryExecModeCacheStatement, true, false},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			pool := onePool(t, url, m.mode)
			s, err := pgengine.New(pool, pgengine.Config{Schema: pgstoretest.Schema(), SimpleProtocol: m.simple})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			// Drop what the migration's checks may have prepared.
			if _, err := pool.Exec(ctx, "DEALLOCATE ALL", pgx.QueryExecModeSimpleProtocol); err != nil {
				t.Fatal(err)
			}
			for _, alg := range algorithms {
				c := newCounter(t, s, pgengine.CounterConfig{Algorithm: alg, Quota: 2, Durability: pgengine.Unlogged})
				for i, want := range []bool{true, true, false} {
					r, err := c.Take(ctx, "k\x00'", 1, "")
					if err != nil || r.Allowed != want || r.Remaining != int64(1-min(i, 1)) {
						t.Fatalf("%v take %d: %+v, %v; want allowed %v", alg, i, r, err, want)
					}
				}
				if r, err := c.Peek(ctx, "k\x00'", 1); err != nil || r.Allowed || r.Remaining != 0 {
					t.Fatalf("%v peek: %+v, %v", alg, r, err)
				}
				if _, err := c.Cleanup(ctx); err != nil {
					t.Fatalf("%v cleanup: %v", alg, err)
				}
				if err := c.Reset(ctx, "k\x00'"); err != nil {
					t.Fatalf("%v reset: %v", alg, err)
				}
			}
			burst := newCounter(t, s, pgengine.CounterConfig{Algorithm: ratekit.TokenBucket, Quota: 3, Durability: pgengine.Logged})
			day := newCounter(t, s, pgengine.CounterConfig{Algorithm: ratekit.FixedWindow, Quota: 2, Durability: pgengine.Logged})
			comp, err := pgengine.NewComposite(burst, day)
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range []bool{true, true, false} {
				rs, err := comp.Take(ctx, "c", 1, nil, "")
				// The burst has room every time; the day, twice; a refused
				// take charges neither.
				if err != nil || rs[1].Allowed != want || rs[0].Used != int64(min(i+1, 2)) {
					t.Fatalf("composite take %d: %+v, %v; want allowed %v", i, rs, err, want)
				}
			}
			var n int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%"+pgstoretest.Schema()+"%'",
				pgx.QueryExecModeSimpleProtocol).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if got := n > 0; got != m.prepares {
				t.Errorf("%d of ratekit's statements prepared on the connection; want prepared %v", n, m.prepares)
			}
		})
	}
}

// TestPreparedRefusedByPgBouncer decides through PgBouncer in transaction
// mode (1.18 keeps no prepared statements across server connections) on a
// pool in pgx's default mode, cache_statement: the Store sends a statement
// whose prepared statement a server connection lacks again in exec mode,
// and every later one too, and counts every admission exactly once. Which
// server connection a statement meets is PgBouncer's choice, and server
// connections keep what earlier tests prepared, so bursts on fresh keys
// run until a Store has seen a refusal (at most 5).
func TestPreparedRefusedByPgBouncer(t *testing.T) {
	url := pgstoretest.PgBouncerURL(t)
	ctx := ctxT(t)
	const instances, goroutines, quota = 4, 32, 100
	prefix := pgstoretest.Prefix(t)
	var stores []*pgengine.Store
	var counters []*pgengine.Counter
	for range instances {
		p := pgstoretest.Pool(t, url, 4, "")
		if p.Config().ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
			t.Fatalf("pool mode %v, want pgx's default", p.Config().ConnConfig.DefaultQueryExecMode)
		}
		s := newStore(t, p)
		stores = append(stores, s)
		counters = append(counters, newCounter(t, s, pgengine.CounterConfig{Prefix: prefix, Algorithm: ratekit.FixedWindow, Quota: quota, Durability: pgengine.Unlogged}))
	}
	// unprepared counts the Stores whose statement a server connection
	// refused: they have turned prepared statements off.
	unprepared := func() int {
		off := 0
		for _, s := range stores {
			if pgengine.Unprepared(s) {
				off++
			}
		}
		return off
	}
	for burst := 0; burst < 5 && unprepared() == 0; burst++ {
		key := "hot-" + strconv.Itoa(burst)
		var admitted atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, instances*goroutines)
		for _, c := range counters {
			for range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 5 {
						r, err := c.Take(ctx, key, 1, "")
						if err != nil {
							errs <- err
							return
						}
						if r.Allowed {
							admitted.Add(1)
						}
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if got := admitted.Load(); got != quota {
			t.Errorf("burst %d: %d admitted, want %d", burst, got, quota)
		}
	}
	if unprepared() == 0 {
		t.Errorf("no Store saw PgBouncer refuse a prepared statement in 5 bursts; the test decided nothing through one")
	}
}
