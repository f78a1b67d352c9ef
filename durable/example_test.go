package durable_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
)

// A paid tier of 1000 calls a day, exactly, stored in a logged table. The
// pool connects lazily, so nothing here touches the network until Allow.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal/app?pool_max_conns=2&pool_ping_timeout=1s")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	limiter, err := durable.New(durable.Config{
		Store:      store,
		Policy:     ratekit.Policy{Name: "pro-daily", Quota: 1000, Window: 24 * time.Hour, Algorithm: ratekit.FixedWindow},
		Durability: durable.Logged,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(limiter.Policy().Name, limiter.Policy().Quota)
	// Output: pro-daily 1000
}

// Invalid configuration is reported by New, before any database work.
func ExampleNew_invalidPrefix() {
	pool, _ := pgxpool.New(context.Background(), "postgres://app@db.internal/app")
	defer pool.Close()
	store, _ := pgstore.New(pool, pgstore.Config{})
	_, err := durable.New(durable.Config{
		Store:  store,
		Policy: ratekit.Policy{Name: "signup", Quota: 5, Window: time.Hour, Algorithm: ratekit.SlidingLog},
		Prefix: "signup'; DROP TABLE users; --", Durability: durable.Unlogged,
	})
	fmt.Println(err != nil)
	// Output: true
}
