// Package serverless_test checks the Redis stores' ServerlessOptions end
// to end on the shared test Redis: in TLS (through a TLS proxy whose
// certificate names 127.0.0.1), with the dialers a user passes, and with a
// lone caller's reads polled (busypoll) in each case.
package serverless_test

import (
	"context"
	"crypto/tls"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/kvstore/rueidisstore"
)

// takes makes 50 takes of one unit on key "k" of s, from a bucket of
// 10^12 that refills one unit per second, and checks that each leaves
// one unit less.
func takes(t *testing.T, s kvstore.Atomic) {
	t.Helper()
	r := kvstore.Refill{Burst: 1e12, Rate: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var prev int64
	for i := range 50 {
		res, err := s.Update(ctx, "k", r, kvstore.OpTake, 1e6)
		if err != nil {
			t.Fatalf("take %d: %v", i, err)
		}
		if !res.OK || i > 0 && (res.Remaining >= prev || res.Remaining < prev-1e6) {
			t.Fatalf("take %d: %+v after %d remaining", i, res, prev)
		}
		prev = res.Remaining
	}
}

// goRedis returns a redisstore on a client configured by
// ServerlessOptions from o, with a prefix of the test's own.
func goRedis(t *testing.T, o *redis.UniversalOptions) *redisstore.Store {
	t.Helper()
	c := redis.NewUniversalClient(redisstore.ServerlessOptions(o, time.Second))
	t.Cleanup(func() { c.Close() })
	s, err := redisstore.New(c, redisstore.Config{Prefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// rueidisClient returns a rueidisstore on a client configured by
// ServerlessOptions from o, with a prefix of the test's own, or the
// client's error.
func rueidisClient(t *testing.T, o rueidis.ClientOption) (*rueidisstore.Store, error) {
	t.Helper()
	o.DisableCache = true
	c, err := rueidis.NewClient(*rueidisstore.ServerlessOptions(&o, time.Second))
	if err != nil {
		return nil, err
	}
	t.Cleanup(c.Close)
	return rueidisstore.New(c, rueidisstore.Config{Prefix: redistest.Prefix(t)})
}

// TestServerlessOptionsInTLS: with a TLSConfig that names no server, the
// stores' serverless dialers shake hands with the address's host (a
// certificate for 127.0.0.1 verifies; the same config naming another
// server does not) and decide over the TLS connection.
func TestServerlessOptionsInTLS(t *testing.T) {
	proxy, pool := testenv.TLSProxy(t, testenv.RedisAddr(t))
	t.Run("redisstore", func(t *testing.T) {
		takes(t, goRedis(t, &redis.UniversalOptions{Addrs: []string{proxy}, TLSConfig: &tls.Config{RootCAs: pool}}))
		s := goRedis(t, &redis.UniversalOptions{Addrs: []string{proxy}, TLSConfig: &tls.Config{RootCAs: pool, ServerName: "example.com"}})
		if _, err := s.Update(context.Background(), "k", kvstore.Refill{Burst: 10, Rate: 1}, kvstore.OpTake, 1); err == nil {
			t.Error("a certificate for 127.0.0.1 verified as example.com")
		}
	})
	t.Run("rueidisstore", func(t *testing.T) {
		s, err := rueidisClient(t, rueidis.ClientOption{InitAddress: []string{proxy}, TLSConfig: &tls.Config{RootCAs: pool}})
		if err != nil {
			t.Fatal(err)
		}
		takes(t, s)
		if _, err := rueidisClient(t, rueidis.ClientOption{InitAddress: []string{proxy}, TLSConfig: &tls.Config{RootCAs: pool, ServerName: "example.com"}}); err == nil {
			t.Error("a certificate for 127.0.0.1 verified as example.com")
		}
	})
	// Plain TCP to a TLS server fails: the decisions above went in TLS.
	if _, err := rueidisClient(t, rueidis.ClientOption{InitAddress: []string{proxy}, Dialer: net.Dialer{Timeout: 200 * time.Millisecond}}); err == nil {
		t.Error("a client without TLS talked to the TLS proxy")
	}
}

// TestServerlessOptionsKeepUserDialers: the dialer a user set before
// ServerlessOptions dials every connection (go-redis's Dialer, rueidis's
// DialCtxFn and DialFn).
func TestServerlessOptionsKeepUserDialers(t *testing.T) {
	addr := testenv.RedisAddr(t)
	var dials atomic.Int32
	dial := func(ctx context.Context, network, a string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, a)
	}
	// check makes the store (whose client may dial at once) and its
	// takes, and counts the dials.
	check := func(t *testing.T, store func() kvstore.Atomic) {
		t.Helper()
		dials.Store(0)
		takes(t, store())
		if dials.Load() == 0 {
			t.Error("the user's dialer dialed nothing")
		}
	}
	t.Run("redisstore Dialer", func(t *testing.T) {
		check(t, func() kvstore.Atomic { return goRedis(t, &redis.UniversalOptions{Addrs: []string{addr}, Dialer: dial}) })
	})
	rueidisStore := func(t *testing.T, o rueidis.ClientOption) func() kvstore.Atomic {
		return func() kvstore.Atomic {
			s, err := rueidisClient(t, o)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	}
	t.Run("rueidisstore DialCtxFn", func(t *testing.T) {
		check(t, rueidisStore(t, rueidis.ClientOption{InitAddress: []string{addr},
			DialCtxFn: func(ctx context.Context, a string, _ *net.Dialer, _ *tls.Config) (net.Conn, error) {
				return dial(ctx, "tcp", a)
			}}))
	})
	t.Run("rueidisstore DialFn", func(t *testing.T) {
		check(t, rueidisStore(t, rueidis.ClientOption{InitAddress: []string{addr},
			DialFn: func(a string, _ *net.Dialer, _ *tls.Config) (net.Conn, error) {
				return dial(context.Background(), "tcp", a)
			}}))
	})
}
