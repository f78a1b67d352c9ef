package chaostest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/breaker"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/internal/pgtest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/pgstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	// deadline is the caller's deadline for each decision, and timeout
	// the guard's bound on each limiter call, which leaves the fallback
	// time of its own.
	deadline = 200 * time.Millisecond
	timeout  = 100 * time.Millisecond
	// Margin is the documented bound on how late after its caller's
	// deadline a decision returns (README, "Failure and recovery").
	margin = 100 * time.Millisecond
	// attempts is the number of decisions made during each fault.
	attempts = 5
	// limit is the quota of every limiter: no refill during a test.
	limit = 100
)

// A backend builds a limiter whose store is reached through listen, and
// tells how many units it has used.
type backend struct {
	name     string
	upstream func(t *testing.T) string
	limiter  func(t *testing.T, listen string) ratekit.Limiter
}

func backends() []backend {
	return []backend{
		{
			name:     "redis",
			upstream: func(t *testing.T) string { return testenv.RedisAddr(t) },
			limiter: func(t *testing.T, listen string) ratekit.Limiter {
				client := redis.NewUniversalClient(redisstore.ServerlessOptions(&redis.UniversalOptions{Addrs: []string{listen}}, 0))
				b := make([]byte, 6)
				rand.Read(b)
				prefix := "ratekit-test:chaos:" + hex.EncodeToString(b) + ":"
				t.Cleanup(func() {
					direct := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
					direct.Del(context.Background(), prefix+"{chaos:k}")
					direct.Close()
					client.Close()
				})
				store, err := redisstore.New(client, redisstore.Config{Prefix: prefix})
				if err != nil {
					t.Fatal(err)
				}
				l, err := tokenbucket.New(tokenbucket.Config{Name: "chaos", Burst: limit, RefillRate: tokenbucket.PerHour(limit), Mode: tokenbucket.Atomic, Store: store})
				if err != nil {
					t.Fatal(err)
				}
				return l
			},
		},
		{
			name: "postgres",
			upstream: func(t *testing.T) string {
				u, err := url.Parse(testenv.PostgresURL(t))
				if err != nil {
					t.Fatal(err)
				}
				return u.Host
			},
			limiter: func(t *testing.T, listen string) ratekit.Limiter {
				u, _ := url.Parse(testenv.PostgresURL(t))
				u.Host = listen
				pool := pgtest.Pool(t, u.String(), 4, "")
				store, err := pgstore.New(pool, pgstore.Config{Schema: pgtest.Schema()})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := store.Migrate(ctx); err != nil {
					t.Fatal(err)
				}
				l, err := durable.New(durable.Config{Store: store, Algorithm: ratekit.FixedWindow,
					Policy: ratekit.Policy{Name: "chaos", Quota: limit, Window: time.Hour}, Prefix: pgtest.Prefix(t)})
				if err != nil {
					t.Fatal(err)
				}
				return l
			},
		},
	}
}

// A fault is injected into a running proxy and healed.
type fault struct {
	name string
	// reaches reports whether a request during the fault may reach the
	// store (and so may be counted).
	reaches bool
	inject  func(t *testing.T, p *toxiproxy.Proxy)
	heal    func(t *testing.T, p *toxiproxy.Proxy)
}

func addToxic(t *testing.T, p *toxiproxy.Proxy, js string) {
	t.Helper()
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		t.Fatal(err)
	}
}

func removeToxic(t *testing.T, p *toxiproxy.Proxy, name string) {
	t.Helper()
	if err := p.Toxics.RemoveToxic(context.Background(), name); err != nil {
		t.Fatal(err)
	}
}

var faults = []fault{
	{
		// Replies take 2 s: far past the caller's deadline.
		name: "latency", reaches: true,
		inject: func(t *testing.T, p *toxiproxy.Proxy) {
			addToxic(t, p, `{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":2000}}`)
		},
		heal: func(t *testing.T, p *toxiproxy.Proxy) { removeToxic(t, p, "slow") },
	},
	{
		// Every connection that sends data is reset (TCP RST). Bytes
		// already on their way may still reach the store and be counted
		// while the client sees the reset (seen about once in 15 runs
		// with PostgreSQL).
		name: "reset", reaches: true,
		inject: func(t *testing.T, p *toxiproxy.Proxy) {
			addToxic(t, p, `{"name":"rst","type":"reset_peer","stream":"upstream","attributes":{"timeout":0}}`)
		},
		heal: func(t *testing.T, p *toxiproxy.Proxy) { removeToxic(t, p, "rst") },
	},
	{
		// The store is gone: open connections close, new ones are refused.
		name: "outage", reaches: false,
		inject: func(t *testing.T, p *toxiproxy.Proxy) { p.Stop() },
		heal: func(t *testing.T, p *toxiproxy.Proxy) {
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
		},
	},
}

type policy struct {
	name     string
	onError  ratekit.FailurePolicy
	fallback func(t *testing.T) ratekit.Limiter
	// check tells whether a result during the fault honours the policy.
	check func(res ratekit.Result, h http.Header) error
}

type failing struct{}

func (failing) Allow(context.Context, ratekit.Request) (ratekit.Decision, error) {
	return ratekit.Decision{}, errors.New("the fallback is down too")
}

func memoryFallback(t *testing.T) ratekit.Limiter {
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := tokenbucket.New(tokenbucket.Config{Name: "fallback", Burst: 10, RefillRate: tokenbucket.PerMinute(10), Mode: tokenbucket.Atomic, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func closed(res ratekit.Result, h http.Header) error {
	if res.Status != http.StatusServiceUnavailable || !strings.Contains(string(res.Body), ratekit.ProblemTypeTemporaryReducedCapacity) || res.Err == nil {
		return fmt.Errorf("want 503 temporary-reduced-capacity, got status %d body %s err %v", res.Status, res.Body, res.Err)
	}
	return nil
}

var policies = []policy{
	{name: "fail-closed", onError: ratekit.FailClosed, check: closed},
	{name: "fail-open", onError: ratekit.FailOpen, check: func(res ratekit.Result, h http.Header) error {
		if !res.Proceed() || res.Decided || res.Err == nil || h.Get(ratekit.HeaderRateLimit) != "" {
			return fmt.Errorf("want the request let through undecided with no RateLimit field, got %+v, header %v", res, h)
		}
		return nil
	}},
	{name: "fallback", onError: ratekit.UseFallback, fallback: memoryFallback, check: func(res ratekit.Result, h http.Header) error {
		if !res.Decided || res.Err == nil || !strings.Contains(h.Get(ratekit.HeaderRateLimitPolicy), `"fallback"`) {
			return fmt.Errorf("want the fallback's decision, got %+v, header %v", res, h)
		}
		return nil
	}},
	{name: "fallback-down", onError: ratekit.UseFallback, fallback: func(*testing.T) ratekit.Limiter { return failing{} }, check: closed},
}

func newProxy(t *testing.T, upstream string) *toxiproxy.Proxy {
	t.Helper()
	p := toxiproxy.NewProxy(toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop()), "chaos", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

var req = ratekit.Request{Key: "k", Cost: 1}

// check makes one decision through g under the caller's deadline and
// returns it with the time it took.
func check(g *ratekit.Guard) (ratekit.Result, http.Header, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	h := http.Header{}
	start := time.Now()
	res := g.Check(ctx, req, h)
	return res, h, time.Since(start)
}

// used returns how many units the store counted, read through the
// limiter's Peek.
func used(t *testing.T, l ratekit.Limiter) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := l.(ratekit.Peeker).Peek(ctx, req)
	if err != nil {
		t.Fatalf("peek after healing: %v", err)
	}
	return limit - d.Remaining
}

func TestFaults(t *testing.T) {
	for _, be := range backends() {
		for _, f := range faults {
			for _, pol := range policies {
				for _, withBreaker := range []bool{false, true} {
					name := be.name + "/" + f.name + "/" + pol.name
					if withBreaker {
						name += "/breaker"
					}
					t.Run(name, func(t *testing.T) {
						t.Parallel()
						runFault(t, be, f, pol, withBreaker)
					})
				}
			}
		}
	}
}

func runFault(t *testing.T, be backend, f fault, pol policy, withBreaker bool) {
	p := newProxy(t, be.upstream(t))
	store := be.limiter(t, p.Listen)
	l := store
	var b *breaker.Limiter
	if withBreaker {
		var err error
		b, err = breaker.New(store, breaker.Config{Failures: 2, OpenFor: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		l = b
	}
	cfg := ratekit.GuardConfig{Limiter: l, OnError: pol.onError, Timeout: timeout, Logger: slog.New(slog.DiscardHandler)}
	if pol.fallback != nil {
		cfg.Fallback = pol.fallback(t)
	}
	g, err := ratekit.NewGuard(cfg)
	if err != nil {
		t.Fatal(err)
	}
	successes := int64(0)
	if res, _, _ := check(g); !res.Decided || res.Err != nil || !res.Decision.Allowed {
		t.Fatalf("before the fault: %+v", res)
	}
	successes++

	f.inject(t, p)
	var worst time.Duration
	for i := 0; i < attempts; i++ {
		res, h, took := check(g)
		worst = max(worst, took)
		if took > deadline+margin {
			t.Errorf("attempt %d returned after %v; deadline %v + margin %v", i, took, deadline, margin)
		}
		if err := pol.check(res, h); err != nil {
			t.Errorf("attempt %d: %.300v", i, err)
		}
		if withBreaker && i >= 2 {
			if !errors.Is(res.Err, breaker.ErrOpen) || took > 20*time.Millisecond {
				t.Errorf("attempt %d with the circuit open: %v after %v; want ErrOpen at once", i, res.Err, took)
			}
		}
	}
	t.Logf("slowest decision during the fault: %v (deadline %v)", worst, deadline)

	f.heal(t, p)
	if withBreaker {
		time.Sleep(550 * time.Millisecond) // OpenFor: the next request probes
	}
	// Recovery without recreating the limiter, pool or client.
	recovered := false
	tries, failedTries := 0, int64(0)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && !recovered; tries++ {
		res, _, _ := check(g)
		if res.Decided && res.Err == nil {
			recovered = res.Decision.Allowed
			successes++
		} else {
			failedTries++
			time.Sleep(50 * time.Millisecond)
		}
	}
	if !recovered {
		t.Fatalf("no decision succeeded in 5 s after the fault healed")
	}
	t.Logf("recovered after %d tries", tries)
	if withBreaker && b.State() != breaker.Closed {
		t.Errorf("circuit %v after a successful probe", b.State())
	}
	// Nothing was counted twice by the limiter's own retries: every unit
	// is a successful decision or one failed attempt that may have reached
	// the store (after healing, any failed try may have); during an outage
	// nothing could reach it.
	if f.name == "latency" {
		time.Sleep(2 * time.Second) // let the delayed replies drain
	}
	n := used(t, store)
	most := successes + failedTries
	if f.reaches {
		most += attempts
	}
	if n < successes || n > most {
		t.Fatalf("the store counted %d units; %d decisions succeeded and %d failed attempts may have reached it (want %d..%d)", n, successes, most-successes, successes, most)
	}
}
