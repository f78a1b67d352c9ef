package breaker_test

import (
	"fmt"
	"time"

	"github.com/ratekit/ratekit/breaker"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/signedwindow"
	"github.com/ratekit/ratekit/tokenbucket"
)

// A token bucket (here in memory; in production on Redis) behind a circuit
// breaker, with a signed-window limiter as the fallback while the store is
// down or the circuit is open.
func Example() {
	store, _ := memstore.New(memstore.Config{})
	bucket, _ := tokenbucket.New(tokenbucket.Config{
		Name: "api", Burst: 100, RefillRate: tokenbucket.PerMinute(100),
		Mode: tokenbucket.Atomic, Store: store,
	})
	guarded, err := breaker.New(bucket, breaker.Config{Failures: 5, OpenFor: 10 * time.Second})
	if err != nil {
		panic(err)
	}
	fallback, _ := signedwindow.New(signedwindow.Config{
		Name: "api", Quota: 100, Window: time.Minute,
		Keys: []signedwindow.Key{{ID: 1, Secret: []byte("an example secret of at least 32 bytes")}},
	})
	_, err = httplimit.NewGuard(httplimit.GuardConfig{
		Limiter:  guarded,
		OnError:  httplimit.UseFallback,
		Fallback: fallback,
		Timeout:  100 * time.Millisecond,
	})
	fmt.Println(err, guarded.State())
	// Output: <nil> Closed
}
