package memstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/memstore"
)

// TestUpdateMultiBoundedStore runs multi-key takes over more keys than a
// store of MaxKeys 1, 2 and 3 can hold, from 16 goroutines mixed with
// single-key Updates: the calls must finish (an insert makes room by
// evicting, the call's own keys included) and the store must never hold
// more than MaxKeys keys.
func TestUpdateMultiBoundedStore(t *testing.T) {
	r := kvstore.Refill{Burst: 1 << 40, Rate: 1}
	for _, maxKeys := range []int{1, 2, 3} {
		t.Run(fmt.Sprint(maxKeys), func(t *testing.T) {
			s := newStore(t, memstore.Config{MaxKeys: maxKeys})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			for w := 0; w < 16; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 300; i++ {
						if w%4 == 0 {
							if _, err := s.Update(ctx, fmt.Sprint("k", rand.IntN(6)), r, kvstore.OpTake, 1); err != nil {
								errs <- err
								return
							}
							continue
						}
						perm := rand.Perm(6)[:2+rand.IntN(3)]
						u := make([]kvstore.Update, len(perm))
						for j, p := range perm {
							u[j] = kvstore.Update{Key: fmt.Sprint("k", p), Refill: r, N: 1}
						}
						if err := s.UpdateMulti(ctx, "", kvstore.OpTake, u, make([]kvstore.OpResult, len(u))); err != nil {
							errs <- err
							return
						}
						if n := s.Len(); n > maxKeys {
							errs <- fmt.Errorf("Len %d > MaxKeys %d", n, maxKeys)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
		})
	}
}

// TestUpdateMultiOnInjectedClock checks that a multi-key take reads the
// store's clock once, for every key: two keys emptied together refill
// together.
func TestUpdateMultiOnInjectedClock(t *testing.T) {
	c := newClock()
	s := newStore(t, memstore.Config{Now: c.Now})
	ctx := context.Background()
	r := kvstore.Refill{Burst: 10, Rate: 1}
	u := []kvstore.Update{{Key: "a", Refill: r, N: 10}, {Key: "b", Refill: r, N: 10}}
	res := make([]kvstore.OpResult, 2)
	if err := s.UpdateMulti(ctx, "", kvstore.OpTake, u, res); err != nil || !res[0].OK || !res[1].OK || res[0].Remaining != 0 || res[1].Remaining != 0 {
		t.Fatalf("take all = %+v, %v", res, err)
	}
	c.Add(3 * time.Microsecond)
	u[0].N, u[1].N = 4, 3
	if err := s.UpdateMulti(ctx, "", kvstore.OpTake, u, res); err != nil || res[0].OK || res[0].Remaining != 3 || !res[1].OK || res[1].Remaining != 3 {
		t.Fatalf("3µs later, take 4 and 3 = %+v, %v; want a lacking at 3, b able at 3", res, err)
	}
	c.Add(7 * time.Microsecond)
	u[0].N, u[1].N = 10, 10
	if err := s.UpdateMulti(ctx, "", kvstore.OpPeek, u, res); err != nil || !res[0].OK || !res[1].OK {
		t.Fatalf("10µs after emptying, peek 10 and 10 = %+v, %v; want both full", res, err)
	}
}
