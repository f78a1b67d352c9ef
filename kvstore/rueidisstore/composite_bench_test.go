package rueidisstore_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// BenchmarkComposite compares, side by side in one run, a decision of a
// composite of two buckets (one script over both keys) with a decision of
// one bucket, on the shared Redis through rueidis, in parallel over 10,000
// keys. The buckets never deny.
func BenchmarkComposite(b *testing.B) {
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
	}
	p := prefix(b)
	goRedis(b, p) // removes the keys at cleanup
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{testenv.RedisAddr(b)}, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	s, err := rueidisstore.New(c, rueidisstore.Config{Prefix: p})
	if err != nil {
		b.Fatal(err)
	}
	big := tokenbucket.Rate{Tokens: 1, Per: 100 * time.Millisecond}
	single, err := tokenbucket.New(tokenbucket.Config{Name: "burst", Burst: 1 << 30, RefillRate: big, Mode: tokenbucket.Atomic, Store: s})
	if err != nil {
		b.Fatal(err)
	}
	composite, err := tokenbucket.NewComposite(tokenbucket.CompositeConfig{Mode: tokenbucket.Atomic, Store: s, Buckets: []tokenbucket.Bucket{
		{Name: "burst", Burst: 1 << 30, RefillRate: big},
		{Name: "daily", Burst: 1 << 30, RefillRate: big},
	}})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		l    ratekit.Limiter
	}{{"single", single}, {"composite2", composite}} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			var seq atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1)) * 7919
				for pb.Next() {
					if _, err := bc.l.Allow(ctx, ratekit.Request{Key: keys[i%len(keys)], Cost: 1}); err != nil {
						b.Error(err)
						return
					}
					i++
				}
			})
		})
	}
}
