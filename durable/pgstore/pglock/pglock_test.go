package pglock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratekit/ratekit/durable/pgstore/pglock"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/internal/testenv"
)

// TestMain checks for leaked goroutines, as the store's tests did when these
// lived beside them.
func TestMain(m *testing.M) { pgstoretest.Main(m, testenv.CheckLeaks) }

func TestHashKeyMatchesSQL(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 1, "")
	ctx := ctxT(t)
	for _, name := range []string{"", "job:42", "invoice/2026-11", "日本語", "o'brien"} {
		var got int64
		err := pool.QueryRow(ctx, `SELECT ('x' || left(encode(sha256(convert_to($1, 'UTF8')), 'hex'), 16))::bit(64)::bigint`, name).Scan(&got)
		if err != nil {
			t.Fatal(err)
		}
		if want := pglock.HashKey(name); got != want {
			t.Errorf("HashKey(%q) = %d, SQL gives %d", name, want, got)
		}
	}
	if pglock.HashKey("a") == pglock.HashKey("b") {
		t.Error("HashKey collides on a and b")
	}
}

func TestSessionLock(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 4, "")
	ctx := ctxT(t)
	k1 := pglock.Key("job:" + pgstoretest.NewSchema())
	k2 := pglock.NamespacedKey(7, "invoice:"+pgstoretest.NewSchema())

	l, err := pglock.TryLock(ctx, pool, k2, k1, k1)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Keys(); len(got) != 2 || got[0] != k1 || got[1] != k2 {
		t.Fatalf("Keys() = %v, want [%v %v] (sorted, deduplicated)", got, k1, k2)
	}
	// Held: try-once fails at once, with nothing left held.
	if _, err := pglock.TryLock(ctx, pool, k2); !errors.Is(err, pglock.ErrLockNotAcquired) {
		t.Fatalf("TryLock of a held lock: %v", err)
	}
	// Blocking with a deadline gives up at the deadline.
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	start := time.Now()
	_, err = pglock.Lock(wctx, pool, k1)
	cancel()
	if !errors.Is(err, pglock.ErrLockNotAcquired) {
		t.Fatalf("Lock of a held lock: %v", err)
	}
	if took := time.Since(start); took < 200*time.Millisecond || took > 2*time.Second {
		t.Fatalf("Lock gave up after %v with a 300 ms deadline", took)
	}
	// A waiter gets the lock when it is released.
	got := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		l2, err := pglock.Lock(wctx, pool, k1, k2)
		if err == nil {
			err = l2.Unlock(ctx)
		}
		got <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("second Unlock: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	// Everything is free again, and no hijacked connection is left.
	l3, err := pglock.TryLock(ctx, pool, k1, k2)
	if err != nil {
		t.Fatal(err)
	}
	l3.Unlock(ctx)
}

// TestLockNoDeadlock has goroutines lock two keys in opposite orders: with
// sorted acquisition they take turns instead of deadlocking, and the
// critical sections never overlap.
func TestLockNoDeadlock(t *testing.T) {
	pool := pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 4, "")
	ctx := ctxT(t)
	a, b := pglock.Key("a:"+pgstoretest.NewSchema()), pglock.Key("b:"+pgstoretest.NewSchema())
	var inside, max atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		keys := []pglock.LockKey{a, b}
		if i%2 == 1 {
			keys = []pglock.LockKey{b, a}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 5; j++ {
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				l, err := pglock.Lock(wctx, pool, keys...)
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
				n := inside.Add(1)
				if n > max.Load() {
					max.Store(n)
				}
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				if err := l.Unlock(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if max.Load() != 1 {
		t.Fatalf("%d holders at once", max.Load())
	}
}

func TestTxLock(t *testing.T) {
	for _, via := range []string{"postgres", "pgbouncer"} {
		t.Run(via, func(t *testing.T) {
			url := pgstoretest.PostgresURL(t)
			if via == "pgbouncer" {
				url = pgstoretest.PgBouncerURL(t)
			}
			pool := pgstoretest.Pool(t, url, 4, "")
			ctx := ctxT(t)
			k := pglock.NamespacedKeyID(11, int32(pglock.HashKey(pgstoretest.NewSchema())))
			tx1, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx1.Rollback(ctx)
			if err := pglock.LockTx(ctx, tx1, k); err != nil {
				t.Fatal(err)
			}
			tx2, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx2.Rollback(ctx)
			if err := pglock.TryLockTx(ctx, tx2, k); !errors.Is(err, pglock.ErrLockNotAcquired) {
				t.Fatalf("TryLockTx of a held lock: %v", err)
			}
			// A wait long enough that the server-side lock_timeout (the
			// deadline minus a margin of up to 250 ms) fires before the
			// client-side deadline even on a loaded machine: with 200 ms the
			// margin was 40 ms, and a late timer made it a deadline error.
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err = pglock.LockTx(wctx, tx2, k)
			cancel()
			if !errors.Is(err, pglock.ErrLockNotAcquired) {
				t.Fatalf("LockTx of a held lock: %v", err)
			}
			// tx2 is still usable and its lock_timeout is its own again. The
			// test's own query runs in exec mode too: the pool keeps pgx's
			// statement cache, which PgBouncer in transaction mode breaks.
			var lt string
			if err := tx2.QueryRow(ctx, "SHOW lock_timeout", pgx.QueryExecModeExec).Scan(&lt); err != nil || lt != "0" {
				t.Fatalf("tx2 after a failed lock: lock_timeout %q, %v", lt, err)
			}
			if err := tx1.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := pglock.LockTx(ctx, tx2, k); err != nil {
				t.Fatalf("LockTx after release: %v", err)
			}
			if err := tx2.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
