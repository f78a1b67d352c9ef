package limitertest_test

import (
	"fmt"

	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/limitertest"
	"github.com/ratekit/ratekit/tokenbucket"
)

// Burst is the exactness check of the suite on its own: 64 goroutines,
// each its own client, make 10 requests each on one key of a bucket of
// 100 that refills one token an hour. An exact limiter admits exactly 100.
// In a test, limitertest.Run(t, limitertest.Harness{...}) runs this and
// every other check of the ratekit.Limiter contract against your limiter.
func ExampleBurst() {
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	l, err := tokenbucket.New(tokenbucket.Config{
		Name:       "api",
		Burst:      100,
		RefillRate: tokenbucket.PerHour(1),
		Mode:       tokenbucket.Atomic,
		Store:      store,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	admitted, err := limitertest.Burst(l, "client-42", limitertest.Workers, 10, false)
	fmt.Println(admitted, err)
	// Output: 100 <nil>
}
