package durable_test

import (
	"context"
	"fmt"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/internal/itest/faultproxy"
)

// BenchmarkComposite compares, side by side in one run, a decision of one
// policy ("single"), a composite decision of two policies (a fixed window
// and a token bucket on the same key, "composite2") and the same two
// policies decided by two calls ("two-calls", one round trip each, not
// atomic), all admitted, over 1000 keys from one pool.
func BenchmarkComposite(b *testing.B) {
	ctx := context.Background()
	p := pgstoretest.Prefix(b)
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("customer-%04d", i)
	}
	limiters := func(s *pgstore.Store) (single, burst, daily *durable.Limiter) {
		return newLimiter(b, s, ratekit.FixedWindow, "single", p+"-s", 1<<40, farWindow),
			newLimiter(b, s, ratekit.FixedWindow, "burst", p+"-b", 1<<40, farWindow),
			newLimiter(b, s, ratekit.TokenBucket, "daily", p+"-d", 1<<40, farWindow)
	}
	// Create every row and ANALYZE, on a pool of its own: on a table
	// without statistics the planner may pick the expiry index for key
	// lookups, and the functions' sessions keep such plans.
	fill := pgstoretest.Pool(b, pgstoretest.PostgresURL(b), 1, "")
	{
		s, err := pgstore.New(fill, pgstore.Config{Schema: pgstoretest.Schema()})
		if err != nil {
			b.Fatal(err)
		}
		single, burst, daily := limiters(s)
		composite := newComposite(b, burst, daily)
		for _, k := range keys {
			for _, l := range []ratekit.Limiter{single, composite} {
				if _, err := l.Allow(ctx, ratekit.Request{Key: k, Cost: 1}); err != nil {
					b.Fatal(err)
				}
			}
		}
		if _, err := fill.Exec(ctx, `ANALYZE "`+pgstoretest.Schema()+`".counters`); err != nil {
			b.Fatal(err)
		}
	}
	// On loopback, a round trip costs less than the server's work; behind
	// a network (1 ms more per round trip here, through a proxy), the round
	// trips that a composite saves are most of a decision's cost.
	proxy := faultproxy.Start(b, postgresHost(b))
	proxy.ReplyLatency(time.Millisecond)
	for _, network := range []struct{ name, url string }{
		{"loopback", pgstoretest.PostgresURL(b)},
		{"rtt+1ms", viaProxy(b, pgstoretest.PostgresURL(b), proxy.Listen)},
	} {
		s := newStore(b, network.url, 4)
		single, burst, daily := limiters(s)
		composite := newComposite(b, burst, daily)
		for _, bc := range []struct {
			name string
			l    ratekit.Limiter
		}{{"single", single}, {"composite2", composite}, {"two-calls", twoCalls{burst, daily}}} {
			b.Run(network.name+"/"+bc.name, func(b *testing.B) {
				var n atomic.Int64
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					i := int(n.Add(1)) * 7919
					for pb.Next() {
						i++
						d, err := bc.l.Allow(ctx, ratekit.Request{Key: keys[i%len(keys)], Cost: 1})
						if err != nil || !d.Allowed {
							b.Errorf("%+v, %v", d, err)
							return
						}
					}
				})
			})
		}
	}
}

// postgresHost returns the host:port of the test server.
func postgresHost(t testing.TB) string {
	t.Helper()
	u, err := url.Parse(pgstoretest.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// viaProxy returns rawURL with its host:port replaced by addr.
func viaProxy(t testing.TB, rawURL, addr string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

// twoCalls decides two policies one after the other, as a caller without a
// composite would.
type twoCalls [2]ratekit.Limiter

func (t twoCalls) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	if d, err := t[0].Allow(ctx, req); err != nil || !d.Allowed {
		return d, err
	}
	return t[1].Allow(ctx, req)
}
