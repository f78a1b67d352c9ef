package pgstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratekit/ratekit/durable/pgstore"
)

// One Store per pool, shared by every durable limiter of the process. New
// does not contact the database: the schema is created by the first
// decision, or by Migrate at start-up.
func ExampleNew() {
	cfg, err := pgxpool.ParseConfig("postgres://app@db.internal/app?pool_max_conns=2")
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pgstore.ServerlessPoolConfig(cfg, 250*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgstore.New(pool, pgstore.Config{Schema: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(store.Schema())
	// Output: billing
}
