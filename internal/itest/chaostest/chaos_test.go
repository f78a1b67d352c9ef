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
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/kvstore/redisstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

func TestMain(m *testing.M) { pgstoretest.Main(m, testenv.CheckLeaks) }

const (
	// timeout is the guard's bound on each limiter call (and fallback
	// call), and deadline the caller's deadline for each decision, which
	// leaves the fallback time of its own even on a busy machine. During
	// a fault a decision returns by the guard's bound (bound), which is
	// what is tested; the caller's deadline is the outer bound.
	timeout  = 100 * time.Millisecond
	deadline = 2 * time.Second
	// Margin is the documented bound on how late after its deadline a
	// decision returns (README, "Failure and recovery").
	margin = 100 * time.Millisecond
	// farWindow is the fixed windows' span. Fixed windows are aligned to
	// the epoch: with an hour, a test running across the hour counted
	// nothing before it. A window of 1000 days rolls over once in 1000
	// days.
	farWindow = 1000 * 24 * time.Hour
	// attempts is the number of decisions made during each fault.
	attempts = 5
	// limit is the quota of every limiter: no refill during a test.
	limit = 100
	// openFor is how long the breaker's circuit stays open.
	openFor = 500 * time.Millisecond
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
				// One unit a day: nothing refills during a test, however
				// long a busy machine makes it.
				l, err := tokenbucket.New(tokenbucket.Config{Name: "chaos", Burst: limit, RefillRate: tokenbucket.Rate{Tokens: 1, Per: 24 * time.Hour}, Mode: tokenbucket.Atomic, Store: store})
				if err != nil {
					t.Fatal(err)
				}
				return l
			},
		},
		{
			name: "postgres",
			upstream: func(t *testing.T) string {
				u, err := url.Parse(pgstoretest.PostgresURL(t))
				if err != nil {
					t.Fatal(err)
				}
				return u.Host
			},
			limiter: func(t *testing.T, listen string) ratekit.Limiter {
				u, _ := url.Parse(pgstoretest.PostgresURL(t))
				u.Host = listen
				pool := pgstoretest.Pool(t, u.String(), 4, "")
				store, err := pgstore.New(pool, pgstore.Config{Schema: pgstoretest.Schema()})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := store.Migrate(ctx); err != nil {
					t.Fatal(err)
				}
				l, err := durable.New(durable.Config{Store: store,
					Policy: ratekit.Policy{Name: "chaos", Quota: limit, Window: farWindow, Algorithm: ratekit.FixedWindow}, Prefix: pgstoretest.Prefix(t), Durability: durable.Unlogged})
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
		// Replies take five times the caller's deadline: none can come
		// back in time, however late a loaded machine runs the code
		// that cuts a call off at its deadline (with replies that took
		// as long as the deadline, 2 s, two decisions of
		// TestCoalescedFaults succeeded during the fault under load).
		// Removing the toxic lets the replies held back go at once.
		name: "latency", reaches: true,
		inject: func(t *testing.T, p *toxiproxy.Proxy) {
			addToxic(t, p, fmt.Sprintf(`{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":%d}}`, (5*deadline).Milliseconds()))
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
	onError  httplimit.FailurePolicy
	fallback func(t *testing.T) ratekit.Limiter
	// check tells whether a result during the fault honours the policy.
	check func(res httplimit.Verdict, h http.Header) error
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

func closed(res httplimit.Verdict, h http.Header) error {
	if res.Status != http.StatusServiceUnavailable || !strings.Contains(string(res.Body), httplimit.ProblemTypeTemporaryReducedCapacity) || res.Err == nil {
		return fmt.Errorf("want 503 temporary-reduced-capacity, got status %d body %s err %v", res.Status, res.Body, res.Err)
	}
	return nil
}

var policies = []policy{
	{name: "fail-closed", onError: httplimit.FailClosed, check: closed},
	{name: "fail-open", onError: httplimit.FailOpen, check: func(res httplimit.Verdict, h http.Header) error {
		if !res.Proceed() || res.Decided || res.Err == nil || h.Get(httplimit.HeaderRateLimit) != "" {
			return fmt.Errorf("want the request let through undecided with no RateLimit field, got %+v, header %v", res, h)
		}
		return nil
	}},
	{name: "fallback", onError: httplimit.UseFallback, fallback: memoryFallback, check: func(res httplimit.Verdict, h http.Header) error {
		if !res.Decided || res.Err == nil || !strings.Contains(h.Get(httplimit.HeaderRateLimitPolicy), `"fallback"`) {
			return fmt.Errorf("want the fallback's decision, got %+v, header %v", res, h)
		}
		return nil
	}},
	{name: "fallback-down", onError: httplimit.UseFallback, fallback: func(*testing.T) ratekit.Limiter { return failing{} }, check: closed},
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

// bound is how long the guard may take to decide under pol when the store
// fails: its timeout on the limiter call, and another on the fallback's,
// at most the caller's deadline.
func bound(pol policy) time.Duration {
	if pol.fallback != nil {
		return min(2*timeout, deadline)
	}
	return min(timeout, deadline)
}

// check makes one decision through g under the caller's deadline and
// returns it with the time it took.
func check(g *httplimit.Guard) (httplimit.Verdict, http.Header, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	h := http.Header{}
	start := time.Now()
	res := g.Check(ctx, req, h)
	return res, h, time.Since(start)
}

// patience bounds how long a call that is not under test (setting up,
// recovering, reading the result) may keep being retried: on a busy machine
// one attempt can miss the client's own timeouts (250 ms for Redis).
const patience = 20 * time.Second

// allowPatiently makes decisions through l, each with a second to finish,
// until one succeeds or patience runs out, and returns how many attempts
// failed first (each may have reached the store and been counted).
func allowPatiently(t *testing.T, l ratekit.Limiter, what string) (failed int64) {
	t.Helper()
	var err error
	for end := time.Now().Add(patience); time.Now().Before(end); failed++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var d ratekit.Decision
		d, err = l.Allow(ctx, req)
		cancel()
		if err == nil {
			if !d.Allowed {
				t.Fatalf("%s: denied %+v", what, d)
			}
			return failed
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: no decision succeeded in %v (%d attempts): %v", what, patience, failed, err)
	return failed
}

// used returns how many units the store counted, read through the
// limiter's Peek (retried: reading is not what is tested).
func used(t *testing.T, l ratekit.Limiter) int64 {
	t.Helper()
	var err error
	for end := time.Now().Add(patience); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var d ratekit.Decision
		d, err = l.(ratekit.Peeker).Peek(ctx, req)
		cancel()
		if err == nil {
			return limit - d.Remaining
		}
	}
	t.Fatalf("peek after healing: %v", err)
	return 0
}

func TestFaults(t *testing.T) {
	late := testenv.MeasureLateness(t)
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
						runFault(t, be, f, pol, withBreaker, late)
					})
				}
			}
		}
	}
}

func runFault(t *testing.T, be backend, f fault, pol policy, withBreaker bool, late *testenv.Lateness) {
	p := newProxy(t, be.upstream(t))
	store := be.limiter(t, p.Listen)
	l := store
	var b *breaker.Limiter
	if withBreaker {
		var err error
		b, err = breaker.New(store, breaker.Config{Failures: 2, OpenFor: openFor})
		if err != nil {
			t.Fatal(err)
		}
		l = b
	}
	cfg := httplimit.GuardConfig{Limiter: l, OnError: pol.onError, Timeout: timeout, Logger: slog.New(slog.DiscardHandler)}
	if pol.fallback != nil {
		cfg.Fallback = pol.fallback(t)
	}
	g, err := httplimit.NewGuard(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Setting up is not under test: the first decision dials the store
	// (and loads the script), which a busy machine can make slower than
	// the guard's timeout, so it goes to the limiter with a patient
	// deadline. Then the guard must decide before the fault; its failed
	// tries, if the machine makes any, may have been counted.
	successes, failedTries := int64(1), allowPatiently(t, l, "before the fault")
	for end := time.Now().Add(patience); ; failedTries++ {
		res, _, _ := check(g)
		if res.Decided && res.Err == nil && res.Decision.Allowed {
			successes++
			break
		}
		if time.Now().After(end) {
			t.Fatalf("before the fault, no decision through the guard in %v: %+v", patience, res)
		}
	}

	f.inject(t, p)
	var worst time.Duration
	// opening is when the attempt that opens the circuit (the second
	// failure) starts: the circuit stays open until at least OpenFor
	// after it.
	var opening time.Time
	for i := 0; i < attempts; i++ {
		if i == 1 {
			opening = time.Now()
		}
		res, h, took := check(g)
		worst = max(worst, took)
		// The bound is the guard's (or the caller's deadline, if
		// sooner) and the documented margin; a busy machine may run the
		// returning goroutine late by as much as it runs any goroutine
		// late, measured meanwhile.
		if lateness := late.Max(); took > bound(pol)+margin+lateness {
			t.Errorf("attempt %d returned after %v; bound %v + margin %v + scheduling lateness %v", i, took, bound(pol), margin, lateness)
		}
		if err := pol.check(res, h); err != nil {
			t.Errorf("attempt %d: %.300v", i, err)
		}
		if withBreaker && i >= 2 {
			if time.Since(opening) >= openFor {
				// A stall let OpenFor pass: the circuit may be probing.
				t.Logf("attempt %d came %v after the circuit opened (OpenFor %v): not checked", i, time.Since(opening), openFor)
				continue
			}
			// At once: well within the guard's timeout, which any call
			// that reached the faulty store would take.
			if lateness := late.Max(); !errors.Is(res.Err, breaker.ErrOpen) || took > 20*time.Millisecond+lateness {
				t.Errorf("attempt %d with the circuit open: %v after %v; want ErrOpen at once (20ms + scheduling lateness %v)", i, res.Err, took, lateness)
			}
		}
	}
	t.Logf("slowest decision during the fault: %v (bound %v, scheduling lateness up to %v)", worst, bound(pol), late.Max())

	f.heal(t, p)
	if withBreaker {
		time.Sleep(openFor + 50*time.Millisecond) // the next request probes
	}
	// Recovery without recreating the limiter, pool or client (nor the
	// circuit). The store has to dial again, which is not bounded by the
	// guard's timeout on a busy machine: the decisions go to the limiter
	// with a patient deadline.
	failed := allowPatiently(t, l, "after the fault healed")
	failedTries += failed
	successes++
	t.Logf("recovered after %d tries", failed+1)
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
