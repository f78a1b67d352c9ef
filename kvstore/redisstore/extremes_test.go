package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratekit/ratekit/internal/extremes"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
)

// TestNewExtremes feeds MaxInFlight extreme values: New returns a store or
// an error matching ratekit.ErrInvalidConfig, never panics nor reserves
// memory for the number, and a store it returns answers an update on the
// shared test Redis.
func TestNewExtremes(t *testing.T) {
	p := redistest.Prefix(t)
	c := newClient(t, testenv.RedisAddr(t), p)
	for _, v := range extremes.Ints {
		var s *redisstore.Store
		if !extremes.Check(t, extremes.Name("MaxInFlight", v), func() (err error) {
			s, err = redisstore.New(c, redisstore.Config{Prefix: p, MaxInFlight: int(v)})
			return err
		}) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		res, err := s.Update(ctx, "k", kvstore.Refill{Burst: 10, Rate: 1}, kvstore.OpTake, 1)
		cancel()
		if err != nil {
			t.Fatalf("MaxInFlight %d: Update: %v", v, err)
		}
		if res.Remaining < 0 || res.Remaining > 10 {
			t.Fatalf("MaxInFlight %d: Update: %+v", v, res)
		}
	}
}
