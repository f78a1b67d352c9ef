package otelratekit_test

import (
	"context"
	"fmt"
	"log"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/otelratekit"
	"github.com/ratekit/ratekit/tokenbucket"
)

// An observer on a limiter. A program passes its own MeterProvider (and
// TracerProvider); this one records nowhere.
func ExampleNewObserver() {
	obs, err := otelratekit.NewObserver(otelratekit.Config{
		MeterProvider: noop.NewMeterProvider(),
		NoSpans:       true,
		Strategy:      "tokenbucket",
		Store:         "memory",
	})
	if err != nil {
		log.Fatal(err)
	}
	store, _ := memstore.New(memstore.Config{MaxKeys: 1000})
	bucket, err := tokenbucket.New(tokenbucket.Config{Name: "quote", Burst: 2, RefillRate: tokenbucket.PerHour(1), Mode: tokenbucket.Atomic, Store: store})
	if err != nil {
		log.Fatal(err)
	}
	limiter := ratekit.Observe(bucket, obs)
	for range 3 {
		d, err := limiter.Allow(context.Background(), ratekit.Request{Key: "client-1", Cost: 1})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(d.Allowed, d.Remaining)
	}
	// Output:
	// true 1
	// true 0
	// false 0
}
