package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratekit/ratekit/durable/pgstore/pglock"
)

// Keys print as pg_locks shows them: the bigint form as one number, the
// two-integer form as "namespace,id".
func ExampleLockKey() {
	fmt.Println(pglock.KeyID(42))
	fmt.Println(pglock.NamespacedKeyID(7, 42))
	fmt.Println(pglock.Key("job:42") == pglock.KeyID(pglock.HashKey("job:42")))
	// Output:
	// 42
	// 7,42
	// true
}

// One worker per invoice: the transaction holds the invoice's lock until it
// commits or rolls back, and another worker's TryLockTx on the same invoice
// fails with ErrLockNotAcquired meanwhile. Transaction-level locks work
// through PgBouncer in transaction mode.
func ExampleTryLockTx() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal/app?default_query_exec_mode=exec")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	err = pglock.TryLockTx(ctx, tx, pglock.NamespacedKey(1, "invoice:2026-0042"))
	if errors.Is(err, pglock.ErrLockNotAcquired) {
		return // another worker has it
	}
	if err != nil {
		log.Fatal(err)
	}
	// … bill the invoice within tx …
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}
