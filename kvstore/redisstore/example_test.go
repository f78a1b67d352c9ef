package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// Over Redis, Atomic mode runs one Lua script per decision on Redis's clock.
// Build the client with serverless-safe timeouts so that a slow Redis
// returns an error within the function's deadline.
func Example_tokenbucket() {
	client := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{
		Addrs: []string{"127.0.0.1:6379"}, // several addresses for Cluster; MasterName for Sentinel
	}, 200*time.Millisecond))
	defer client.Close()
	store, err := redisstore.New(client, redisstore.Config{Prefix: "myapp:"})
	if err != nil {
		log.Fatal(err)
	}
	limiter, err := tokenbucket.New(tokenbucket.Config{
		Name:            "free-tier",
		Burst:           100,
		RefillRate:      tokenbucket.PerMinute(100),
		Mode:            tokenbucket.Atomic,
		Store:           store,
		DeniedCacheSize: 10_000, // blocked clients cost no round trip
	})
	if err != nil {
		log.Fatal(err)
	}
	d, err := limiter.Allow(context.Background(), ratekit.Request{Key: "user-42", Cost: 1})
	if err != nil {
		log.Print(err) // fail open or closed: the caller's choice
		return
	}
	fmt.Println(d.Allowed)
}
