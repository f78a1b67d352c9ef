package tokenbucket_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ratekit/ratekit/internal/fakeclock"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/leakcheck"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/limitertest"
	"github.com/ratekit/ratekit/tokenbucket"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// clock is the shared fake clock.
type clock = fakeclock.Clock

func newClock() *clock { return fakeclock.New(time.Date(2026, 11, 22, 6, 0, 0, 0, time.UTC)) }

func memStore(t testing.TB, now func() time.Time) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newLimiter(t testing.TB, cfg tokenbucket.Config) *tokenbucket.Limiter {
	t.Helper()
	l, err := tokenbucket.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// eventualOnly hides the Atomic capability of a store.
type eventualOnly struct{ kvstore.Store }

func TestNewRefusesInvalidConfig(t *testing.T) {
	store := memStore(t, nil)
	good := tokenbucket.Config{Name: "p", Burst: 10, RefillRate: tokenbucket.PerSecond(1), Mode: tokenbucket.Atomic, Store: store}
	if _, err := tokenbucket.New(good); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for name, mutate := range map[string]func(*tokenbucket.Config){
		"empty name":          func(c *tokenbucket.Config) { c.Name = "" },
		"name with space":     func(c *tokenbucket.Config) { c.Name = "a b" },
		"zero burst":          func(c *tokenbucket.Config) { c.Burst = 0 },
		"negative burst":      func(c *tokenbucket.Config) { c.Burst = -1 },
		"zero tokens":         func(c *tokenbucket.Config) { c.RefillRate.Tokens = 0 },
		"zero period":         func(c *tokenbucket.Config) { c.RefillRate.Per = 0 },
		"negative period":     func(c *tokenbucket.Config) { c.RefillRate.Per = -time.Second },
		"sub-µs period":       func(c *tokenbucket.Config) { c.RefillRate.Per = 1500 * time.Nanosecond },
		"refill above burst":  func(c *tokenbucket.Config) { c.RefillRate = tokenbucket.Rate{Tokens: 11, Per: time.Microsecond} },
		"units above 2^53":    func(c *tokenbucket.Config) { c.Burst, c.RefillRate = 1<<40, tokenbucket.PerHour(1) },
		"no mode":             func(c *tokenbucket.Config) { c.Mode = 0 },
		"unknown mode":        func(c *tokenbucket.Config) { c.Mode = 7 },
		"nil store":           func(c *tokenbucket.Config) { c.Store = nil },
		"atomic, plain store": func(c *tokenbucket.Config) { c.Store = eventualOnly{store} },
		"negative cache":      func(c *tokenbucket.Config) { c.DeniedCacheSize = -1 },
	} {
		cfg := good
		mutate(&cfg)
		if _, err := tokenbucket.New(cfg); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("%s: New = %v, want ratekit.ErrInvalidConfig", name, err)
		}
	}
	cfg := good
	cfg.Mode, cfg.Store = tokenbucket.Eventual, eventualOnly{store}
	if _, err := tokenbucket.New(cfg); err != nil {
		t.Errorf("Eventual over a plain Store: %v", err)
	}
}

func TestPolicy(t *testing.T) {
	for _, tc := range []struct {
		burst int64
		rate  tokenbucket.Rate
		want  time.Duration
	}{
		{100, tokenbucket.PerMinute(100), time.Minute},
		{10, tokenbucket.PerSecond(3), 3333333334 * time.Nanosecond}, // 10/3 s, rounded up
		{60, tokenbucket.PerSecond(1), time.Minute},
		{5, tokenbucket.PerHour(1), 5 * time.Hour},
	} {
		l := newLimiter(t, tokenbucket.Config{Name: "api", Burst: tc.burst, RefillRate: tc.rate, Mode: tokenbucket.Eventual, Store: memStore(t, nil)})
		want := ratekit.Policy{Name: "api", Quota: tc.burst, Window: tc.want, Algorithm: ratekit.TokenBucket}
		if got := l.Policy(); got != want {
			t.Errorf("burst %d, %+v: Policy = %+v, want %+v", tc.burst, tc.rate, got, want)
		}
	}
}

func TestRequestValidation(t *testing.T) {
	for _, mode := range []tokenbucket.Mode{tokenbucket.Eventual, tokenbucket.Atomic} {
		l := newLimiter(t, tokenbucket.Config{Name: "p", Burst: 5, RefillRate: tokenbucket.PerSecond(1), Mode: mode, Store: memStore(t, nil)})
		ctx := context.Background()
		for _, tc := range []struct {
			req  ratekit.Request
			want error
		}{
			{ratekit.Request{Key: "", Cost: 1}, ratekit.ErrEmptyKey},
			{ratekit.Request{Key: strings.Repeat("k", ratekit.MaxKeyLen+1), Cost: 1}, ratekit.ErrKeyTooLong},
			{ratekit.Request{Key: "k", Cost: 0}, ratekit.ErrInvalidCost},
			{ratekit.Request{Key: "k", Cost: -3}, ratekit.ErrInvalidCost},
			{ratekit.Request{Key: "k", Cost: 6}, ratekit.ErrCostExceedsQuota},
		} {
			for name, call := range map[string]func(context.Context, ratekit.Request) (ratekit.Decision, error){
				"Allow": l.Allow, "Peek": l.Peek, "Refund": l.Refund,
			} {
				if _, err := call(ctx, tc.req); !errors.Is(err, tc.want) || !errors.Is(err, ratekit.ErrInvalidRequest) {
					t.Errorf("%v %s(%+v) = %v, want %v", mode, name, tc.req, err, tc.want)
				}
			}
		}
		if err := l.Reset(ctx, ""); !errors.Is(err, ratekit.ErrEmptyKey) {
			t.Errorf("%v Reset(\"\") = %v", mode, err)
		}
		if d, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: 5}); err != nil || !d.Allowed {
			t.Errorf("%v: a cost equal to burst: %+v, %v", mode, d, err)
		}
	}
}

// step is one call in a deterministic scenario.
type step struct {
	advance time.Duration
	call    string // allow, peek, refund, reset
	cost    int64
	want    ratekit.Decision // Policy and Limit are filled in by the test
}

func runSteps(t *testing.T, mode tokenbucket.Mode, cacheSize int, burst int64, rate tokenbucket.Rate, steps []step) {
	t.Helper()
	c := newClock()
	l := newLimiter(t, tokenbucket.Config{Name: "p", Burst: burst, RefillRate: rate, Mode: mode, Store: memStore(t, c.Now), Now: c.Now, DeniedCacheSize: cacheSize})
	ctx := context.Background()
	for i, s := range steps {
		c.Add(s.advance)
		req := ratekit.Request{Key: "k", Cost: s.cost}
		var got ratekit.Decision
		var err error
		switch s.call {
		case "allow":
			got, err = l.Allow(ctx, req)
		case "peek":
			got, err = l.Peek(ctx, req)
		case "refund":
			got, err = l.Refund(ctx, req)
		case "reset":
			err = l.Reset(ctx, "k")
			got = s.want
		}
		if err != nil {
			t.Fatalf("step %d (%s %d): %v", i, s.call, s.cost, err)
		}
		want := s.want
		want.Quota, want.Policy = burst, l.Policy()
		if s.call == "reset" {
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d (+%v %s %d):\n got %+v\nwant %+v", i, s.advance, s.call, s.cost, got, want)
		}
	}
}

func TestDecisionsOnInjectedClock(t *testing.T) {
	us := time.Microsecond
	// Burst 10, 3 tokens per second: one token every 333,333⅓µs, a refill
	// that no whole number of microseconds or nanoseconds represents.
	steps := []step{
		{0, "allow", 4, ratekit.Decision{Allowed: true, Remaining: 6, ResetAfter: 1333334 * us}},
		{0, "allow", 7, ratekit.Decision{Remaining: 6, RetryAfter: 333334 * us, ResetAfter: 1333334 * us}},
		{0, "peek", 6, ratekit.Decision{Allowed: true, Remaining: 6, ResetAfter: 1333334 * us}},
		{333333 * us, "allow", 7, ratekit.Decision{Remaining: 6, RetryAfter: us, ResetAfter: 1000001 * us}},
		// 333,334µs refilled 1,000,002 units (3 per µs): the 2 left over stay.
		{us, "allow", 7, ratekit.Decision{Allowed: true, Remaining: 0, ResetAfter: 3333333 * us}},
		{0, "allow", 1, ratekit.Decision{Remaining: 0, RetryAfter: 333333 * us, ResetAfter: 3333333 * us}},
		{0, "refund", 2, ratekit.Decision{Allowed: true, Remaining: 2, ResetAfter: 2666666 * us}},
		{0, "refund", 10, ratekit.Decision{Allowed: true, Remaining: 10, ResetAfter: 0}},
		{0, "allow", 10, ratekit.Decision{Allowed: true, Remaining: 0, ResetAfter: 3333334 * us}},
		{0, "reset", 0, ratekit.Decision{}},
		{0, "peek", 10, ratekit.Decision{Allowed: true, Remaining: 10}},
		{0, "allow", 10, ratekit.Decision{Allowed: true, Remaining: 0, ResetAfter: 3333334 * us}},
		{time.Hour, "peek", 1, ratekit.Decision{Allowed: true, Remaining: 10}},
		// The clock steps back an hour: nothing refills, nothing breaks.
		{0, "allow", 10, ratekit.Decision{Allowed: true, Remaining: 0, ResetAfter: 3333334 * us}},
		{-time.Hour, "allow", 1, ratekit.Decision{Remaining: 0, RetryAfter: 333334 * us, ResetAfter: 3333334 * us}},
	}
	for _, mode := range []tokenbucket.Mode{tokenbucket.Eventual, tokenbucket.Atomic} {
		for _, cache := range []int{0, 100} {
			t.Run(mode.String()+map[bool]string{true: "+cache", false: ""}[cache > 0], func(t *testing.T) {
				runSteps(t, mode, cache, 10, tokenbucket.PerSecond(3), steps)
			})
		}
	}
}

func TestNoDrift(t *testing.T) {
	// Burst 100 refilled at 3 tokens per second, emptied, then polled with
	// cost 1 every 100µs for 10 simulated seconds. The level never nears
	// the burst, so nothing is capped away: a token arrives at every k/3 s
	// and exactly 30 polls are admitted, however they fall against the
	// fractional refill.
	for _, mode := range []tokenbucket.Mode{tokenbucket.Eventual, tokenbucket.Atomic} {
		c := newClock()
		l := newLimiter(t, tokenbucket.Config{Name: "p", Burst: 100, RefillRate: tokenbucket.PerSecond(3), Mode: mode, Store: memStore(t, c.Now), Now: c.Now})
		if d, err := l.Allow(context.Background(), ratekit.Request{Key: "k", Cost: 100}); err != nil || !d.Allowed {
			t.Fatalf("emptying the bucket: %+v, %v", d, err)
		}
		admitted := 0
		for i := 0; i < 100_000; i++ {
			c.Add(100 * time.Microsecond)
			d, err := l.Allow(context.Background(), ratekit.Request{Key: "k", Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			if d.Remaining != 0 || d.RetryAfter < 0 || (d.Allowed != (d.RetryAfter == 0)) || d.ResetAfter <= 0 {
				t.Fatalf("out-of-range decision %+v", d)
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted != 30 {
			t.Errorf("%v: admitted %d in 10s at 3/s, want exactly 30", mode, admitted)
		}
	}
}

// TestRetryAfterIsExact checks on random scenarios that a denied request
// admitted RetryAfter later is admitted, and one microsecond earlier is not.
func TestRetryAfterIsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	checked := 0
	defer func() {
		if checked < 50 {
			t.Errorf("only %d of 300 scenarios ended in a denial to check", checked)
		}
	}()
	for i := 0; i < 300; i++ {
		burst := 1 + rng.Int64N(50)
		rate := tokenbucket.Rate{Tokens: 1 + rng.Int64N(20), Per: time.Duration(1+rng.Int64N(5_000_000)) * time.Microsecond}
		if rate.Tokens > burst*int64(rate.Per/time.Microsecond) {
			continue
		}
		mode := []tokenbucket.Mode{tokenbucket.Eventual, tokenbucket.Atomic}[i%2]
		c := newClock()
		l := newLimiter(t, tokenbucket.Config{Name: "p", Burst: burst, RefillRate: rate, Mode: mode, Store: memStore(t, c.Now), Now: c.Now})
		ctx := context.Background()
		l.Allow(ctx, ratekit.Request{Key: "k", Cost: 1 + rng.Int64N(burst)})
		c.Add(time.Duration(rng.Int64N(int64(rate.Per))))
		cost := 1 + rng.Int64N(burst)
		d, _ := l.Allow(ctx, ratekit.Request{Key: "k", Cost: cost})
		if d.Allowed {
			continue
		}
		if d.RetryAfter <= 0 {
			t.Fatalf("denied with RetryAfter %v", d.RetryAfter)
		}
		checked++
		c.Add(d.RetryAfter - time.Microsecond)
		if p, _ := l.Peek(ctx, ratekit.Request{Key: "k", Cost: cost}); p.Allowed {
			t.Fatalf("burst %d rate %+v cost %d: admitted 1µs before RetryAfter %v", burst, rate, cost, d.RetryAfter)
		}
		c.Add(time.Microsecond)
		if p, _ := l.Allow(ctx, ratekit.Request{Key: "k", Cost: cost}); !p.Allowed {
			t.Fatalf("burst %d rate %+v cost %d: denied at RetryAfter %v: %+v", burst, rate, cost, d.RetryAfter, p)
		}
	}
}

// TestExactUnderConcurrency: 64 workers × 50 requests against one key with
// Burst 100 and negligible refill admit exactly 100 in Atomic mode.
func TestExactUnderConcurrency(t *testing.T) {
	for _, cache := range []int{0, 1000} {
		l := newLimiter(t, tokenbucket.Config{Name: "p", Burst: 100, RefillRate: tokenbucket.PerHour(1), Mode: tokenbucket.Atomic, Store: memStore(t, nil), DeniedCacheSize: cache})
		if got := hammer(t, l, 64, 50); got != 100 {
			t.Errorf("denied cache %d: %d admitted, want exactly 100", cache, got)
		}
	}
}

// hammer runs workers × perWorker Allow calls of cost 1 on one key at once
// (limitertest.Burst) and returns the number admitted.
func hammer(t *testing.T, l ratekit.Limiter, workers, perWorker int) int64 {
	t.Helper()
	n, err := limitertest.Burst(l, "hot", workers, perWorker, false)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// atomicOnly hides every method of a store but kvstore.Atomic's, such as
// memstore's Take and Prefixed.
type atomicOnly struct{ kvstore.Atomic }

// TestTakeMatchesUpdate checks that Allow over memstore, which calls the
// store's Take, decides as over the same store seen as a plain
// kvstore.Atomic, which Allow calls Update on, for random costs and times.
func TestTakeMatchesUpdate(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 7))
	for _, r := range []tokenbucket.Rate{tokenbucket.PerSecond(10), tokenbucket.PerSecond(7)} {
		c := newClock()
		cfg := tokenbucket.Config{Name: "t", Burst: 20, RefillRate: r, Mode: tokenbucket.Atomic, Now: c.Now}
		cfg.Store = memStore(t, c.Now)
		take := newLimiter(t, cfg)
		cfg.Store = atomicOnly{memStore(t, c.Now)}
		update := newLimiter(t, cfg)
		ctx := context.Background()
		for i := range 2000 {
			c.Add(time.Duration(rng.Int64N(int64(150 * time.Millisecond))))
			req := ratekit.Request{Key: string(rune('a' + rng.IntN(3))), Cost: 1 + rng.Int64N(25)}
			got, gotErr := take.Allow(ctx, req)
			want, wantErr := update.Allow(ctx, req)
			if !reflect.DeepEqual(got, want) || (gotErr == nil) != (wantErr == nil) {
				t.Fatalf("%v, step %d, %+v: over Take %+v, %v; over Update %+v, %v", r, i, req, got, gotErr, want, wantErr)
			}
		}
	}
}
