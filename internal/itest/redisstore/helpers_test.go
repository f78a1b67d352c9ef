package redisstore_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit/internal/itest/faultproxy"
	"github.com/ratekit/ratekit/internal/itest/redisclient"
	"github.com/ratekit/ratekit/internal/leakcheck"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore/redisstore"
)

// TestMain checks for leaks, toxiproxy's stranded toxics aside: the
// coalescing test resets connections under latency.
func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m, faultproxy.StrandedToxic) }

// newStoreMaxInFlight returns a store on the shared test Redis, under a
// prefix of the test's own, with Config.MaxInFlight set to n, and its client.
func newStoreMaxInFlight(t *testing.T, n int) (*redisstore.Store, *redis.Client) {
	t.Helper()
	p := redistest.Prefix(t)
	c := redisclient.Client(t, testenv.RedisAddr(t), p)
	s, err := redisstore.New(c, redisstore.Config{Prefix: p, MaxInFlight: n})
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

// serverlessClient returns a client of addr built with ServerlessOptions,
// closed at cleanup.
func serverlessClient(t *testing.T, addr string) redis.UniversalClient {
	c := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: []string{addr}}, 0))
	t.Cleanup(func() { c.Close() })
	return c
}
