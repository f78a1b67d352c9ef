package rueidisstore_test

import (
	"context"
	"fmt"
	"log"

	"github.com/redis/rueidis"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// A token bucket on Redis through rueidis, which pipelines concurrent
// callers' commands on one connection: exact across instances (Atomic
// mode: one script per decision, on Redis's clock).
func Example() {
	client, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:  []string{"127.0.0.1:6379"},
		DisableCache: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	store, err := rueidisstore.New(client, rueidisstore.Config{Prefix: "myapp:"})
	if err != nil {
		log.Fatal(err)
	}
	limiter, err := tokenbucket.New(tokenbucket.Config{
		Name:       "api",
		Burst:      20,
		RefillRate: tokenbucket.PerSecond(5),
		Mode:       tokenbucket.Atomic,
		Store:      store,
	})
	if err != nil {
		log.Fatal(err)
	}
	d, err := limiter.Allow(context.Background(), ratekit.Request{Key: "user-42"})
	if err != nil {
		log.Fatal(err) // or fail open or closed: see httplimit.Guard
	}
	fmt.Println(d.Allowed, d.Remaining)
}
