package signedwindow

import (
	"context"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

// BenchmarkCompositeAllow compares a decision of a two-policy Composite
// with one of a single-policy Limiter, side by side, each with a valid
// token and quotas that never run out.
func BenchmarkCompositeAllow(b *testing.B) {
	at := func() time.Time { return t0 }
	keys := []Key{{ID: 1, Secret: secret(1)}}
	ctx := context.Background()
	single := mustNew(b, Config{Name: "burst", Quota: ratekit.MaxQuota, Window: time.Second, Keys: keys, Now: at})
	comp, err := NewComposite(CompositeConfig{
		Policies: []ratekit.Policy{
			{Name: "burst", Quota: ratekit.MaxQuota, Window: time.Second},
			{Name: "daily", Quota: ratekit.MaxQuota, Window: 24 * time.Hour},
		},
		Keys: keys, Now: at,
	})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		l    ratekit.Limiter
	}{{"single", single}, {"composite", comp}} {
		b.Run(bc.name, func(b *testing.B) {
			d, err := bc.l.Allow(ctx, ratekit.Request{Key: "203.0.113.7", Cost: 1})
			if err != nil {
				b.Fatal(err)
			}
			req := ratekit.Request{Key: "203.0.113.7", Cost: 1, State: d.State}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					d, err := bc.l.Allow(ctx, req)
					if err != nil || !d.Allowed || d.StateError != nil {
						b.Fatal(err, d.StateError)
					}
				}
			})
		})
	}
}
