package redisstore_test

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
)

// peekPatiently peeks at "k" in s until a peek succeeds, each with a
// second, for at most 20 seconds. A peek dials, loads the script and warms
// the pool without changing the level, so it can be retried: a test calls
// it to set up, which a busy machine may slow past a client's short
// timeouts, and which is not what the test is about.
func peekPatiently(t *testing.T, s *redisstore.Store, r kvstore.Refill) kvstore.OpResult {
	t.Helper()
	var err error
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var res kvstore.OpResult
		res, err = s.Update(ctx, "k", r, kvstore.OpPeek, 1)
		cancel()
		if err == nil {
			return res
		}
	}
	t.Fatalf("no peek succeeded in 20s: %v", err)
	return kvstore.OpResult{}
}

// scriptCalls returns how many scripts the server of c has run (EVALSHA and
// EVAL), from INFO commandstats.
func scriptCalls(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	stats, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, cmd := range []string{"evalsha", "eval"} {
		if m := regexp.MustCompile(`cmdstat_` + cmd + `:calls=(\d+)`).FindStringSubmatch(stats); m != nil {
			v, _ := strconv.ParseInt(m[1], 10, 64)
			n += v
		}
	}
	return n
}
