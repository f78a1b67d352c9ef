package tokenbucket_test

import (
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/leakcheck"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/limitertest"
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

// hammer runs workers × perWorker Allow calls of cost 1 on one key at once
// (limitertest.Burst) and returns the number admitted.
func hammer(t *testing.T, l ratekit.Limiter, workers, perWorker int) int64 {
	t.Helper()
	n, err := limitertest.Burst(l, "hot", workers, perWorker, false)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
