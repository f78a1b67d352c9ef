package redisstore_test

import (
	"context"
	"testing"
	"time"

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
