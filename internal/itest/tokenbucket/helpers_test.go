package tokenbucket_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/leakcheck"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func memStore(t testing.TB, now func() time.Time) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newLimiter(t testing.TB, cfg tokenbucket.Config) *tokenbucket.Limiter {
	t.Helper()
	l, err := tokenbucket.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// eventualOnly hides the Atomic capability of a store.
type eventualOnly struct{ kvstore.Store }

// hammer runs workers × perWorker Allow calls of cost 1 on one key and
// returns the number admitted.
func hammer(t *testing.T, l ratekit.Limiter, workers, perWorker int) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWorker; i++ {
				d, err := l.Allow(ctx, ratekit.Request{Key: "hot", Cost: 1})
				if err != nil {
					errs <- err
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return admitted.Load()
}
