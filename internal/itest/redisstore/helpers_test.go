package redisstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit/internal/leakcheck"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// prefix returns a key prefix no other test or package uses.
func prefix(t *testing.T) string {
	b := make([]byte, 6)
	rand.Read(b)
	name := strings.NewReplacer("/", ".", "{", "", "}", "").Replace(t.Name())
	return "ratekit-test:" + name + ":" + hex.EncodeToString(b) + ":"
}

// client returns a client of the shared test Redis, closed at cleanup, and
// deletes every key under p at cleanup.
func client(t *testing.T, addr, p string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, p+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
		c.Close()
	})
	return c
}

// newStoreMaxInFlight returns a store on the shared test Redis, under a
// prefix of the test's own, with Config.MaxInFlight set to n, and its client.
func newStoreMaxInFlight(t *testing.T, n int) (*redisstore.Store, *redis.Client) {
	t.Helper()
	p := prefix(t)
	c := client(t, testenv.RedisAddr(t), p)
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

var take1 = kvstore.Refill{Max: 1000, Rate: 1}

// updateWithin runs one take with a deadline and returns its error and how
// long it took.
func updateWithin(s *redisstore.Store, d time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	_, err := s.Update(ctx, "k", take1, kvstore.OpTake, 1)
	return time.Since(start), err
}

// recovers retries a take until it succeeds, for at most 20 seconds, and
// reports how many attempts failed first. Recovering must happen, not
// within a time that a busy machine may exceed.
func recovers(t *testing.T, s *redisstore.Store) int {
	t.Helper()
	failed := 0
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := updateWithin(s, time.Second); err == nil {
			return failed
		}
		failed++
	}
	t.Fatalf("the store did not recover within 20s (%d failed attempts)", failed)
	return failed
}

// slack is how much later than its deadline a call may return on a loaded
// machine, besides the scheduling lateness measured meanwhile (see
// [testenv.Lateness]).
const slack = 150 * time.Millisecond
