package dynamostore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
)

// BenchmarkDecision compares, on one server, a single-key take (one
// bucket, Update) with a plan-shaped decision (a token bucket and a monthly
// counter in one group, UpdateMulti), each goroutine on keys of its own, so
// that both run their common case: one conditional UpdateItem.
//
//	cd kvstore/dynamostore && go test -run '^$' -bench BenchmarkDecision -benchtime 500x -count 5 .
func BenchmarkDecision(b *testing.B) {
	r := kvstore.Refill{Burst: 1 << 40, Rate: 1}
	p := month(time.Now().Add(-time.Hour), 1<<40)
	for _, tc := range []struct {
		name string
		f    func(s *dynamostore.Store, key string) error
	}{
		{"single-key", func(s *dynamostore.Store, key string) error {
			_, err := s.Update(context.Background(), key, r, kvstore.OpTake, 1)
			return err
		}},
		{"plan", func(s *dynamostore.Store, key string) error {
			u := []kvstore.Update{{Key: "rate", Refill: r, N: 1}, {Key: "month", Period: p, N: 1}}
			return s.UpdateMulti(context.Background(), key, kvstore.OpTake, u, make([]kvstore.OpResult, 2))
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := newStore(b, newClient(b, nil), dynamostore.Config{})
			var g atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				key := fmt.Sprint("k", g.Add(1))
				for pb.Next() {
					if err := tc.f(s, key); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
