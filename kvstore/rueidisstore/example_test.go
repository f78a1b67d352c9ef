package rueidisstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// A burst and an hourly budget checked together on Redis through rueidis,
// which pipelines concurrent callers' commands on one connection: Atomic
// mode takes from both buckets in one script, or from neither.
func Example() {
	client, err := rueidis.NewClient(*rueidisstore.ServerlessOptions(&rueidis.ClientOption{
		InitAddress:  []string{"127.0.0.1:6379"},
		DisableCache: true,
	}, 0))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	store, err := rueidisstore.New(client, rueidisstore.Config{Prefix: "myapp:"})
	if err != nil {
		log.Fatal(err)
	}
	limiter, err := tokenbucket.NewComposite(tokenbucket.CompositeConfig{
		Buckets: []tokenbucket.Bucket{
			{Name: "burst", Burst: 20, RefillRate: tokenbucket.PerSecond(5)},
			{Name: "hourly", Burst: 1000, RefillRate: tokenbucket.Rate{Tokens: 1000, Per: time.Hour}},
		},
		Mode:  tokenbucket.Atomic,
		Store: store,
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
