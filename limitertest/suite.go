package limitertest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
)

// Config is the policy the suite asks a [Harness] to build a limiter for:
// Quota units per Window, in the terms of [ratekit.Policy]. A window
// strategy grants Quota units per Window. A token bucket has a burst of
// Quota and refills Quota units per Window (tokenbucket.Config{Burst:
// Quota, RefillRate: tokenbucket.Rate{Tokens: Quota, Per: Window}}), so
// that it empties and refills like a window of the same Quota and
// advertises the same policy.
type Config struct {
	// Name is a valid policy name (see ratekit.ValidatePolicyName).
	Name string

	// Quota is the quota of a window, the burst of a token bucket; at
	// least 1.
	Quota int64

	// Window is the quota's window, or the time a token bucket takes to
	// refill from empty. The suite uses whole seconds.
	Window time.Duration
}

// Harness describes a [ratekit.Limiter] under test. New and Algorithm
// are required.
type Harness struct {
	// New returns a new limiter for cfg. Each call must return a limiter
	// whose keys are separate from those of every limiter New returned
	// before (its own prefix or namespace), even on the same store: the
	// suite checks that with two limiters of one Config.
	New func(t testing.TB, cfg Config) ratekit.Limiter

	// Advance moves the limiter's clock forward by d. Nil means the
	// limiter runs on a real clock (a store's), and the suite checks
	// boundaries with short windows and sleeps, with margins, and starts
	// the checks of windows clear of the hour (see [Checks]).
	Advance func(d time.Duration)

	// Algorithm is the limiter's counting algorithm; it selects the
	// boundary rules.
	Algorithm ratekit.Algorithm

	// ClientState reports that the limiter keeps its state in the client
	// (Decision.State must come back as Request.State). The suite then
	// threads the state of each client through its requests.
	ClientState bool

	// MaxAdmitted, when not nil, is the most that workers goroutines
	// making requests of cost 1 at once on one fresh key of quota limit
	// may be admitted (with no refill during the burst): the strategy's
	// documented bound. Nil means the limiter documents exact counting:
	// exactly limit.
	MaxAdmitted func(workers int, quota int64) int64
}

// Workers is the number of goroutines in the suite's concurrency check.
const Workers = 64

// Run runs every check of the suite against h as subtests of t: one after
// the other when h has a controlled clock (a check moves it), in parallel
// with each other on a real clock (their sleeps overlap). Checks that need a capability the limiter does
// not offer ([ratekit.Peeker], [ratekit.Refunder], [ratekit.Resetter]) pass
// trivially with a log line saying so.
//
// Use it from a test of your own limiter:
//
//	func TestConformance(t *testing.T) {
//		limitertest.Run(t, limitertest.Harness{
//			New:    func(t testing.TB, cfg limitertest.Config) ratekit.Limiter { return newMyLimiter(cfg) },
//			Algorithm: ratekit.TokenBucket,
//		})
//	}
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil || h.Algorithm < ratekit.FixedWindow || h.Algorithm > ratekit.SlidingLog {
		t.Fatal("limitertest: Harness.New and Harness.Algorithm are required")
	}
	for _, c := range Checks() {
		t.Run(c.Name, func(t *testing.T) {
			if h.Advance == nil {
				t.Parallel()
			}
			if err := c.Check(t, h); err != nil {
				t.Error(err)
			}
		})
	}
}

// A Check is one property of the Limiter contract. Check returns nil when
// h's limiter has the property and an error that says how it differs
// otherwise; it calls t only for Helper, Cleanup, Log and to pass t to
// Harness.New.
type Check struct {
	Name  string
	Check func(t testing.TB, h Harness) error
}

// Checks returns the suite's checks, in the order Run runs them. On a real
// clock, a check of a fixed or sliding window that would start within a
// minute of the hour (when its windows of an hour roll over) waits until
// the hour has passed.
func Checks() []Check {
	checks := []Check{
		{"FreshKey", checkFreshKey},
		{"AdvertisedPolicy", checkAdvertisedPolicy},
		{"CostN", checkCostN},
		{"ExhaustExactly", checkExhaust},
		{"DenialTakesNothing", checkDenialTakesNothing},
		{"Boundary", checkBoundary},
		{"FullReset", checkFullReset},
		{"Peek", checkPeek},
		{"Refund", checkRefund},
		{"RefundRecipe", checkRefundRecipe},
		{"Reset", checkReset},
		{"KeyIsolation", checkKeyIsolation},
		{"PrefixIsolation", checkPrefixIsolation},
		{"Validation", checkValidation},
		{"Concurrency", checkConcurrency},
	}
	for i := range checks {
		checks[i].Check = afterRollover(checks[i].Check, func(h Harness) (func(time.Duration), ratekit.Algorithm) { return h.Advance, h.Algorithm })
	}
	return checks
}

// longWindow is the window of checks that must see no refill.
const longWindow = time.Hour

// The clock that the checks of a limiter on a real clock read and wait on
// (the tests of this package replace it).
var (
	wallNow   = time.Now
	wallSleep = time.Sleep
)

// rolloverMargin is how close to a rollover of the checks' long windows a
// check on a real clock does not start: longer than any check takes.
const rolloverMargin = time.Minute

// rolloverSkew is how long after that rollover the check starts, so that a
// store's clock a little behind the process's has passed it too.
const rolloverSkew = 2 * time.Second

// waitOutRollover waits, when the limiter runs on a real clock (advance
// nil) and counts in windows (alg a fixed or sliding window), until the
// checks' windows of longWindow and 2 × longWindow cannot roll over for
// rolloverMargin. Windows start at multiples of their length since the
// Unix epoch, so both roll over at every multiple of longWindow; a check
// that straddled one would see its counts start afresh mid-check and fail
// a correct limiter.
func waitOutRollover(t testing.TB, advance func(time.Duration), alg ratekit.Algorithm) {
	if advance != nil || alg != ratekit.FixedWindow && alg != ratekit.SlidingWindow {
		return
	}
	if left := longWindow - time.Duration(wallNow().UnixNano()%int64(longWindow)); left < rolloverMargin {
		t.Logf("limitertest: waiting %v for the windows of an hour to roll over", left+rolloverSkew)
		wallSleep(left + rolloverSkew)
	}
}

// afterRollover returns check preceded by waitOutRollover, on the clock and
// algorithm that clock reads from the check's harness.
func afterRollover[H any](check func(testing.TB, H) error, clock func(H) (func(time.Duration), ratekit.Algorithm)) func(testing.TB, H) error {
	return func(t testing.TB, h H) error {
		advance, alg := clock(h)
		waitOutRollover(t, advance, alg)
		return check(t, h)
	}
}

func ctxFor() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

// client threads client-carried state for one key through its requests.
type client struct {
	l     ratekit.Limiter
	key   string
	state string
	carry bool
}

func newClient(h Harness, l ratekit.Limiter, key string) *client {
	return &client{l: l, key: key, carry: h.ClientState}
}

func (c *client) req(cost int64) ratekit.Request {
	return ratekit.Request{Key: c.key, Cost: cost, State: c.state}
}

// keep takes the client state of d and returns the error of advertised.
func (c *client) keep(what string, d ratekit.Decision) error {
	if c.carry && d.State != "" {
		c.state = d.State
	}
	return advertised(what, d)
}

// advertised returns an error when d breaks the rule every strategy
// advertises its policy by (see ratekit.Policy): the capacity Decision.Quota is the
// policy's Quota (the RateLimit-Policy q), and Remaining (the RateLimit r)
// is between 0 and it. The suite checks it on every decision it gets.
func advertised(what string, d ratekit.Decision) error {
	if d.Quota != d.Policy.Quota || d.Remaining < 0 || d.Remaining > d.Policy.Quota {
		return fmt.Errorf("%s: Quota %d, Remaining (r) %d, Policy.Quota (q) %d: want Quota = q and 0 <= r <= q", what, d.Quota, d.Remaining, d.Policy.Quota)
	}
	return nil
}

func (c *client) allow(cost int64) (ratekit.Decision, error) {
	ctx, cancel := ctxFor()
	defer cancel()
	d, err := c.l.Allow(ctx, c.req(cost))
	if err != nil {
		return d, fmt.Errorf("Allow(key %.40q, cost %d): %w", c.key, cost, err)
	}
	return d, c.keep("Allow", d)
}

// want returns an error when d does not have the given outcome and
// remaining units.
func want(what string, d ratekit.Decision, allowed bool, remaining int64) error {
	if d.Allowed != allowed || d.Remaining != remaining {
		return fmt.Errorf("%s: Allowed %v, Remaining %d; want Allowed %v, Remaining %d (decision %+v)", what, d.Allowed, d.Remaining, allowed, remaining, d)
	}
	return nil
}

func sane(what string, d ratekit.Decision, cfg Config, alg ratekit.Algorithm) error {
	switch {
	case d.Quota != cfg.Quota:
		return fmt.Errorf("%s: Quota %d, want %d", what, d.Quota, cfg.Quota)
	case d.Remaining < 0 || d.Remaining > d.Quota:
		return fmt.Errorf("%s: Remaining %d outside 0..%d", what, d.Remaining, d.Quota)
	case d.RetryAfter < 0 || d.ResetAfter < 0:
		return fmt.Errorf("%s: negative RetryAfter %v or ResetAfter %v", what, d.RetryAfter, d.ResetAfter)
	case d.Allowed && d.RetryAfter != 0:
		return fmt.Errorf("%s: admitted with RetryAfter %v, want 0", what, d.RetryAfter)
	case !d.Allowed && d.RetryAfter <= 0:
		return fmt.Errorf("%s: denied with RetryAfter %v, want > 0", what, d.RetryAfter)
	case d.RetryAfter > 2*cfg.Window || d.ResetAfter > 2*cfg.Window:
		return fmt.Errorf("%s: RetryAfter %v or ResetAfter %v beyond two windows of %v", what, d.RetryAfter, d.ResetAfter, cfg.Window)
	case alg != ratekit.SlidingWindow && d.RetryAfter > d.ResetAfter:
		return fmt.Errorf("%s: RetryAfter %v after ResetAfter %v", what, d.RetryAfter, d.ResetAfter)
	case d.Policy.Name != cfg.Name || d.Policy.Quota != cfg.Quota || d.Policy.Window != cfg.Window:
		return fmt.Errorf("%s: Policy %+v, want name %q, quota %d, window %v", what, d.Policy, cfg.Name, cfg.Quota, cfg.Window)
	}
	return nil
}

// take makes n requests of cost 1 and wants each admitted with the
// remaining count going down from start.
func take(c *client, n int, start int64, cfg Config, alg ratekit.Algorithm) error {
	for i := 0; i < n; i++ {
		d, err := c.allow(1)
		if err != nil {
			return err
		}
		if err := want(fmt.Sprintf("request %d", i+1), d, true, start-int64(i)-1); err != nil {
			return err
		}
		if err := sane(fmt.Sprintf("request %d", i+1), d, cfg, alg); err != nil {
			return err
		}
	}
	return nil
}

func checkFreshKey(t testing.TB, h Harness) error {
	cfg := Config{Name: "fresh", Quota: 5, Window: longWindow}
	c := newClient(h, h.New(t, cfg), "fresh-key")
	d, err := c.allow(1)
	if err != nil {
		return err
	}
	if err := want("first request", d, true, 4); err != nil {
		return err
	}
	return sane("first request", d, cfg, h.Algorithm)
}

// advertisedPolicy is the RateLimit-Policy field that every limiter built
// for the Config {Name: "advertised", Quota: 20, Window: 4s} must send,
// whatever its algorithm: for a token bucket that is a burst of 20 refilled
// at 5 units a second (see [ratekit.Policy] for the rule).
const advertisedPolicy = `"advertised";q=20;w=4`

// checkAdvertisedPolicy: one logical policy renders one RateLimit-Policy
// field byte for byte, and the first request of cost 1 leaves r=19.
func checkAdvertisedPolicy(t testing.TB, h Harness) error {
	cfg := Config{Name: "advertised", Quota: 20, Window: 4 * time.Second}
	c := newClient(h, h.New(t, cfg), "advertised-key")
	d, err := c.allow(1)
	if err != nil {
		return err
	}
	hdr := http.Header{}
	httplimit.SetHeaders(hdr, d, false)
	if got := hdr.Get(httplimit.HeaderRateLimitPolicy); got != advertisedPolicy {
		return fmt.Errorf("RateLimit-Policy %q, want %q (decision %+v)", got, advertisedPolicy, d)
	}
	if got, want := hdr.Get(httplimit.HeaderRateLimit), `"advertised";r=19;t=`; !strings.HasPrefix(got, want) {
		return fmt.Errorf("RateLimit %q, want %q followed by t (decision %+v)", got, want, d)
	}
	return nil
}

func checkCostN(t testing.TB, h Harness) error {
	cfg := Config{Name: "cost", Quota: 10, Window: longWindow}
	c := newClient(h, h.New(t, cfg), "cost-key")
	for _, step := range []struct {
		cost, remaining int64
		allowed         bool
	}{{3, 7, true}, {7, 0, true}, {1, 0, false}} {
		d, err := c.allow(step.cost)
		if err != nil {
			return err
		}
		if err := want(fmt.Sprintf("cost %d", step.cost), d, step.allowed, step.remaining); err != nil {
			return err
		}
		if err := sane(fmt.Sprintf("cost %d", step.cost), d, cfg, h.Algorithm); err != nil {
			return err
		}
	}
	return nil
}

func checkExhaust(t testing.TB, h Harness) error {
	cfg := Config{Name: "exhaust", Quota: 7, Window: longWindow}
	c := newClient(h, h.New(t, cfg), "exhaust-key")
	if err := take(c, 7, 7, cfg, h.Algorithm); err != nil {
		return err
	}
	for i := 0; i < 3; i++ {
		d, err := c.allow(1)
		if err != nil {
			return err
		}
		if err := want("request past the limit", d, false, 0); err != nil {
			return err
		}
		if err := sane("request past the limit", d, cfg, h.Algorithm); err != nil {
			return err
		}
	}
	return nil
}

func checkDenialTakesNothing(t testing.TB, h Harness) error {
	cfg := Config{Name: "denial", Quota: 5, Window: longWindow}
	c := newClient(h, h.New(t, cfg), "denial-key")
	if err := take(c, 3, 5, cfg, h.Algorithm); err != nil {
		return err
	}
	for i := 0; i < 3; i++ {
		d, err := c.allow(3) // 2 remain: denied
		if err != nil {
			return err
		}
		if err := want("cost 3 with 2 remaining", d, false, 2); err != nil {
			return err
		}
	}
	d, err := c.allow(2)
	if err != nil {
		return err
	}
	return want("cost 2 after the denials", d, true, 0)
}

// exhaust takes the whole limit of c's key and returns the denial that
// follows.
func exhaust(c *client, cfg Config, alg ratekit.Algorithm) (ratekit.Decision, error) {
	if err := take(c, int(cfg.Quota), cfg.Quota, cfg, alg); err != nil {
		return ratekit.Decision{}, err
	}
	d, err := c.allow(1)
	if err != nil {
		return d, err
	}
	if err := want("request past the limit", d, false, 0); err != nil {
		return d, err
	}
	return d, sane("request past the limit", d, cfg, alg)
}

// wait moves time forward by d: on the harness's clock, or by sleeping.
func wait(h Harness, d time.Duration) {
	if h.Advance != nil {
		h.Advance(d)
		return
	}
	time.Sleep(d)
}

// boundaryConfig is the policy of the boundary checks: a minute on a
// controlled clock, two seconds on a real one.
func boundaryConfig(h Harness, name string) Config {
	if h.Advance != nil {
		return Config{Name: name, Quota: 4, Window: time.Minute}
	}
	return Config{Name: name, Quota: 2, Window: 2 * time.Second}
}

// checkBoundary: a denied key is still denied shortly before RetryAfter
// has passed, and admits a request of cost 1 once it has.
func checkBoundary(t testing.TB, h Harness) error {
	cfg := boundaryConfig(h, "boundary")
	c := newClient(h, h.New(t, cfg), "boundary-key")
	d, err := exhaust(c, cfg, h.Algorithm)
	if err != nil {
		return err
	}
	retry := d.RetryAfter
	// Just before RetryAfter: a microsecond less than the rounded-up value
	// may already be enough, so check a millisecond before on a controlled
	// clock, and half-way on a real one (scheduling adds time).
	early := retry - time.Millisecond
	if h.Advance == nil {
		early = retry / 2
	}
	if early > 0 && (h.Advance != nil || retry >= 400*time.Millisecond) {
		wait(h, early)
		d, err := c.allow(1)
		if err != nil {
			return err
		}
		if d.Allowed {
			return fmt.Errorf("admitted %v after a denial with RetryAfter %v", early, retry)
		}
		wait(h, retry-early)
	} else {
		wait(h, retry)
	}
	if h.Advance == nil {
		wait(h, 50*time.Millisecond)
	}
	d, err = c.allow(1)
	if err != nil {
		return err
	}
	if !d.Allowed {
		return fmt.Errorf("denied once RetryAfter %v had passed: %+v", retry, d)
	}
	return sane("request after RetryAfter", d, cfg, h.Algorithm)
}

// checkFullReset: once ResetAfter has passed, the full limit is back.
func checkFullReset(t testing.TB, h Harness) error {
	cfg := boundaryConfig(h, "reset-after")
	c := newClient(h, h.New(t, cfg), "reset-after-key")
	d, err := exhaust(c, cfg, h.Algorithm)
	if err != nil {
		return err
	}
	wait(h, d.ResetAfter)
	if h.Advance == nil {
		wait(h, 50*time.Millisecond)
	}
	return take(c, int(cfg.Quota), cfg.Quota, cfg, h.Algorithm)
}

func checkPeek(t testing.TB, h Harness) error {
	cfg := Config{Name: "peek", Quota: 3, Window: longWindow}
	l := h.New(t, cfg)
	p, ok := l.(ratekit.Peeker)
	if !ok {
		t.Log("the limiter is not a ratekit.Peeker")
		return nil
	}
	c := newClient(h, l, "peek-key")
	if err := take(c, 1, 3, cfg, h.Algorithm); err != nil {
		return err
	}
	ctx, cancel := ctxFor()
	defer cancel()
	for i := 0; i < 3; i++ {
		d, err := p.Peek(ctx, c.req(1))
		if err == nil {
			err = advertised("Peek", d)
		}
		if err != nil {
			return fmt.Errorf("peek: %w", err)
		}
		if err := want("Peek", d, true, 2); err != nil {
			return err
		}
		d, err = p.Peek(ctx, c.req(3))
		if err == nil {
			err = advertised("Peek", d)
		}
		if err != nil {
			return fmt.Errorf("peek: %w", err)
		}
		if d.Allowed {
			return fmt.Errorf("peek of cost 3 with 2 remaining reports Allowed: %+v", d)
		}
	}
	if _, err := p.Peek(ctx, ratekit.Request{Key: "", Cost: 1}); !errors.Is(err, ratekit.ErrEmptyKey) {
		return fmt.Errorf("peek with an empty key: %v, want ErrEmptyKey", err)
	}
	return take(c, 2, 2, cfg, h.Algorithm)
}

func checkRefund(t testing.TB, h Harness) error {
	cfg := Config{Name: "refund", Quota: 3, Window: longWindow}
	l := h.New(t, cfg)
	r, ok := l.(ratekit.Refunder)
	if !ok {
		t.Log("the limiter is not a ratekit.Refunder")
		return nil
	}
	c := newClient(h, l, "refund-key")
	if _, err := exhaust(c, cfg, h.Algorithm); err != nil {
		return err
	}
	ctx, cancel := ctxFor()
	defer cancel()
	d, err := r.Refund(ctx, c.req(2))
	if err != nil {
		return fmt.Errorf("refund: %w", err)
	}
	if err := c.keep("Refund", d); err != nil {
		return err
	}
	if err := want("Refund of 2", d, true, 2); err != nil {
		return err
	}
	if err := take(c, 2, 2, cfg, h.Algorithm); err != nil {
		return fmt.Errorf("after a refund of 2: %w", err)
	}
	// Refunds never raise the remaining units above the quota.
	fresh := newClient(h, l, "refund-fresh-key")
	if err := take(fresh, 1, 3, cfg, h.Algorithm); err != nil {
		return err
	}
	d, err = r.Refund(ctx, fresh.req(3))
	if err != nil {
		return fmt.Errorf("refund: %w", err)
	}
	if err := fresh.keep("Refund", d); err != nil {
		return err
	}
	if err := want("Refund of 3 with 1 used", d, true, 3); err != nil {
		return err
	}
	if err := take(fresh, 3, 3, cfg, h.Algorithm); err != nil {
		return fmt.Errorf("after an oversized refund: %w", err)
	}
	d, err = fresh.allow(1)
	if err != nil {
		return err
	}
	if err := want("after an oversized refund, past the limit", d, false, 0); err != nil {
		return err
	}
	if _, err := r.Refund(ctx, ratekit.Request{Key: "k", Cost: 0}); !errors.Is(err, ratekit.ErrInvalidCost) {
		return fmt.Errorf("refund of cost 0: %v, want ErrInvalidCost", err)
	}
	return nil
}

// charge makes a request of cost 1 for c and returns the decision and the
// request as a handler finds it behind ratekit's adapters: through
// httplimit.NewContext and httplimit.RequestFromContext.
func charge(c *client) (ratekit.Request, ratekit.Decision, error) {
	req := c.req(1)
	d, err := c.allow(1)
	if err != nil {
		return req, d, err
	}
	charged, ok := httplimit.RequestFromContext(httplimit.NewContext(context.Background(), req, d))
	if !ok {
		return req, d, errors.New("RequestFromContext found no request in the context NewContext returned")
	}
	return charged, d, nil
}

// refundCharged refunds a charged request as the documented recipe says:
// the request from RequestFromContext, unchanged, to Refund, and the
// refund's Decision.State back to the client.
func refundCharged(r ratekit.Refunder, c *client, charged ratekit.Request) (ratekit.Decision, error) {
	ctx, cancel := ctxFor()
	defer cancel()
	d, err := r.Refund(ctx, charged)
	if err != nil {
		return d, fmt.Errorf("refund: %w", err)
	}
	if err := c.keep("Refund", d); err != nil {
		return d, err
	}
	return d, nil
}

// checkRefundRecipe: two charges and a refund of the second through the
// recipe of httplimit.RequestFromContext leave exactly one unit used, and
// alternating refunded and kept calls admit exactly Quota kept calls.
func checkRefundRecipe(t testing.TB, h Harness) error {
	cfg := Config{Name: "refund-recipe", Quota: 4, Window: longWindow}
	l := h.New(t, cfg)
	r, ok := l.(ratekit.Refunder)
	if !ok {
		t.Log("the limiter is not a ratekit.Refunder")
		return nil
	}
	c := newClient(h, l, "recipe-key")
	if _, d, err := charge(c); err != nil {
		return err
	} else if err := want("first charge", d, true, 3); err != nil {
		return err
	}
	charged, d, err := charge(c)
	if err != nil {
		return err
	}
	if err := want("second charge", d, true, 2); err != nil {
		return err
	}
	d, err = refundCharged(r, c, charged)
	if err != nil {
		return err
	}
	if err := want("refund of the second charge", d, true, 3); err != nil {
		return err
	}
	if err := take(c, 3, 3, cfg, h.Algorithm); err != nil {
		return fmt.Errorf("after charge, charge, refund (one unit used): %w", err)
	}
	d, err = c.allow(1)
	if err != nil {
		return err
	}
	if err := want("past the limit after charge, charge, refund", d, false, 0); err != nil {
		return err
	}

	// A failed (refunded) call between kept ones gives back its own
	// charge only.
	alt := newClient(h, l, "recipe-alternating-key")
	kept := int64(0)
	for round := 0; round < 4*int(cfg.Quota); round++ {
		charged, d, err := charge(alt)
		if err != nil {
			return err
		}
		if !d.Allowed {
			break
		}
		if round%2 == 1 {
			if _, err := refundCharged(r, alt, charged); err != nil {
				return err
			}
			continue
		}
		kept++
	}
	if kept != cfg.Quota {
		return fmt.Errorf("alternating kept and refunded calls: %d kept calls admitted on a limit of %d", kept, cfg.Quota)
	}
	return nil
}

func checkReset(t testing.TB, h Harness) error {
	cfg := Config{Name: "reset", Quota: 3, Window: longWindow}
	l := h.New(t, cfg)
	r, ok := l.(ratekit.Resetter)
	if !ok {
		t.Log("the limiter is not a ratekit.Resetter")
		return nil
	}
	c := newClient(h, l, "reset-key")
	if _, err := exhaust(c, cfg, h.Algorithm); err != nil {
		return err
	}
	other := newClient(h, l, "reset-other-key")
	if err := take(other, 1, 3, cfg, h.Algorithm); err != nil {
		return err
	}
	ctx, cancel := ctxFor()
	defer cancel()
	if err := r.Reset(ctx, c.key); err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	c.state = ""
	if err := take(c, 3, 3, cfg, h.Algorithm); err != nil {
		return fmt.Errorf("after Reset: %w", err)
	}
	if err := take(other, 1, 2, cfg, h.Algorithm); err != nil {
		return fmt.Errorf("another key after Reset: %w", err)
	}
	if err := r.Reset(ctx, "never-seen-key"); err != nil {
		return fmt.Errorf("reset of a key never seen: %w", err)
	}
	if err := r.Reset(ctx, ""); !errors.Is(err, ratekit.ErrEmptyKey) {
		return fmt.Errorf("reset of an empty key: %v, want ErrEmptyKey", err)
	}
	if err := r.Reset(ctx, strings.Repeat("k", ratekit.MaxKeyLen+1)); !errors.Is(err, ratekit.ErrKeyTooLong) {
		return fmt.Errorf("reset of a key of MaxKeyLen+1 bytes: %v, want ErrKeyTooLong", err)
	}
	return nil
}

// isolationKeys are distinct keys that a limiter must count apart,
// including keys that differ only in bytes that text handling loses.
func isolationKeys() []string {
	long := strings.Repeat("k", ratekit.MaxKeyLen-1)
	return []string{
		"k\x00a", "k\x00b", "k", "k ", "K",
		"\xff\xfe", "\xff\xff", "ключ", "{k}", "k:1", "k:1:",
		long + "a", long + "b",
	}
}

func checkKeyIsolation(t testing.TB, h Harness) error {
	cfg := Config{Name: "keys", Quota: 2, Window: longWindow}
	l := h.New(t, cfg)
	keys := isolationKeys()
	// Each key takes one unit more than the one before it, up to the
	// limit, so that a shared count shows.
	for i, k := range keys {
		c := newClient(h, l, k)
		n := i%2 + 1
		if err := take(c, n, 2, cfg, h.Algorithm); err != nil {
			return fmt.Errorf("key %d: %w", i, err)
		}
	}
	// Keys derived from those (a suffix, or for the longest ones a changed
	// first byte) are fresh too.
	for i, k := range keys {
		k2 := k + "/2"
		if len(k2) > ratekit.MaxKeyLen {
			k2 = "2" + k[1:]
		}
		if err := take(newClient(h, l, k2), 1, 2, cfg, h.Algorithm); err != nil {
			return fmt.Errorf("key %d derived: %w", i, err)
		}
	}
	return nil
}

func checkPrefixIsolation(t testing.TB, h Harness) error {
	cfg := Config{Name: "prefix", Quota: 2, Window: longWindow}
	a := newClient(h, h.New(t, cfg), "shared-key")
	b := newClient(h, h.New(t, cfg), "shared-key")
	if _, err := exhaust(a, cfg, h.Algorithm); err != nil {
		return fmt.Errorf("first limiter: %w", err)
	}
	if err := take(b, 2, 2, cfg, h.Algorithm); err != nil {
		return fmt.Errorf("second limiter, same config and key: %w", err)
	}
	return nil
}

func checkValidation(t testing.TB, h Harness) error {
	cfg := Config{Name: "validation", Quota: 3, Window: longWindow}
	l := h.New(t, cfg)
	tooLong := strings.Repeat("k", ratekit.MaxKeyLen+1)
	ctx, cancel := ctxFor()
	defer cancel()
	for _, tc := range []struct {
		name string
		req  ratekit.Request
		want error
	}{
		{"empty key", ratekit.Request{Key: "", Cost: 1}, ratekit.ErrEmptyKey},
		{"key of MaxKeyLen+1 bytes", ratekit.Request{Key: tooLong, Cost: 1}, ratekit.ErrKeyTooLong},
		{"idempotency key of MaxKeyLen+1 bytes", ratekit.Request{Key: "v", Cost: 1, IdempotencyKey: tooLong}, ratekit.ErrKeyTooLong},
		{"cost 0", ratekit.Request{Key: "v", Cost: 0}, ratekit.ErrInvalidCost},
		{"cost -1", ratekit.Request{Key: "v", Cost: -1}, ratekit.ErrInvalidCost},
		{"cost above the limit", ratekit.Request{Key: "v", Cost: 4}, ratekit.ErrCostExceedsQuota},
	} {
		_, err := l.Allow(ctx, tc.req)
		if !errors.Is(err, tc.want) || !errors.Is(err, ratekit.ErrInvalidRequest) {
			return fmt.Errorf("%s: error %v, want one matching %v and ErrInvalidRequest", tc.name, err, tc.want)
		}
	}
	// The invalid requests took nothing, and a key of exactly MaxKeyLen
	// bytes is valid.
	if err := take(newClient(h, l, "v"), 3, 3, cfg, h.Algorithm); err != nil {
		return fmt.Errorf("after invalid requests: %w", err)
	}
	return take(newClient(h, l, tooLong[1:]), 1, 3, cfg, h.Algorithm)
}

// checkConcurrency: Workers goroutines, each a client of its own, make
// requests of cost 1 on one fresh key until 10 × Quota requests were made;
// the admissions are counted exactly.
func checkConcurrency(t testing.TB, h Harness) error {
	cfg := Config{Name: "concurrency", Quota: 100, Window: longWindow}
	l := h.New(t, cfg)
	admitted, err := Burst(l, "hot-key", Workers, 10, h.ClientState)
	if err != nil {
		return err
	}
	if h.MaxAdmitted == nil {
		if admitted != cfg.Quota {
			return fmt.Errorf("%d goroutines admitted %d on a key of quota %d; want exactly %d", Workers, admitted, cfg.Quota, cfg.Quota)
		}
		return nil
	}
	if bound := h.MaxAdmitted(Workers, cfg.Quota); admitted < cfg.Quota || admitted > bound {
		return fmt.Errorf("%d goroutines admitted %d on a key of quota %d; want between %d and the documented bound %d", Workers, admitted, cfg.Quota, cfg.Quota, bound)
	}
	return nil
}

// Burst has workers goroutines make perWorker requests of cost 1 each on
// key at once, each goroutine a client of its own (threading
// Decision.State when clientState is set), and returns how many were
// admitted. It returns the first error a request returned. It is safe to
// call concurrently.
func Burst(l ratekit.Limiter, key string, workers, perWorker int, clientState bool) (int64, error) {
	ctx, cancel := ctxFor()
	defer cancel()
	var (
		admitted atomic.Int64
		wg       sync.WaitGroup
		once     sync.Once
		first    error
		start    = make(chan struct{})
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &client{l: l, key: key, carry: clientState}
			<-start
			for i := 0; i < perWorker; i++ {
				d, err := l.Allow(ctx, c.req(1))
				if err != nil {
					once.Do(func() { first = err })
					return
				}
				if err := c.keep("Allow", d); err != nil {
					once.Do(func() { first = err })
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	return admitted.Load(), first
}
