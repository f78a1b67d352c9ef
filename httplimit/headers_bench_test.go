package httplimit

import (
	"net/http"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

func benchHeaders(b *testing.B, d ratekit.Decision) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		h := http.Header{}
		for pb.Next() {
			SetHeaders(h, d, false)
		}
	})
}

// BenchmarkSetHeaders measures SetHeaders for a decision of one policy and
// for a composite of two.
func BenchmarkSetHeaders(b *testing.B) {
	burst := ratekit.Policy{Name: "burst", Quota: 10, Window: time.Second}
	daily := ratekit.Policy{Name: "daily", Quota: 1000, Window: 24 * time.Hour}
	single := ratekit.Decision{Allowed: true, Quota: 10, Remaining: 9, ResetAfter: time.Second, Policy: burst}
	b.Run("single", func(b *testing.B) { benchHeaders(b, single) })
	b.Run("single-denied", func(b *testing.B) {
		d := single
		d.Allowed, d.Remaining, d.RetryAfter = false, 0, 800*time.Millisecond
		benchHeaders(b, d)
	})
	parts := []ratekit.Decision{single, {Allowed: true, Quota: 1000, Remaining: 998, ResetAfter: 51000 * time.Second, Policy: daily}}
	composite := ratekit.Combine(parts)
	b.Run("composite", func(b *testing.B) { benchHeaders(b, composite) })
}
