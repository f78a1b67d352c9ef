package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ratekit/ratekit/internal/extremes"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/memstore"
)

// TestNewExtremes feeds MaxKeys extreme values: New returns a store or an
// error matching ratekit.ErrInvalidConfig, never panics nor reserves memory
// for the size, and a store it returns holds keys (at most MaxKeys of them)
// and takes any time to live without panicking.
func TestNewExtremes(t *testing.T) {
	ctx := context.Background()
	for _, v := range extremes.Ints {
		var s *memstore.Store
		if !extremes.Check(t, extremes.Name("MaxKeys", v), func() (err error) {
			s, err = memstore.New(memstore.Config{MaxKeys: int(v)})
			return err
		}) {
			continue
		}
		for i, ttl := range extremes.Durations {
			key := fmt.Sprint("k", i)
			err := s.Set(ctx, key, kvstore.Record{}, ttl)
			if (err != nil) != (ttl <= 0) || (err != nil && !errors.Is(err, kvstore.ErrInvalidTTL)) {
				t.Fatalf("MaxKeys %d: Set with ttl %v: %v", v, ttl, err)
			}
			if _, _, err := s.Get(ctx, key); err != nil {
				t.Fatalf("MaxKeys %d: Get: %v", v, err)
			}
		}
		if v > 0 && int64(s.Len()) > v {
			t.Fatalf("MaxKeys %d: holds %d keys", v, s.Len())
		}
	}
}
