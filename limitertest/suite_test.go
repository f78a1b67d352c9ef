package limitertest_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/fakeclock"
	"github.com/ratekit/ratekit/limitertest"
)

// flaw is a defect a test limiter can be built with.
type flaw int

const (
	none             flaw = iota
	ignoresCost           // takes 1 unit whatever the cost
	neverDenies           // admits past the limit
	acceptsEmptyKey       // no validation of empty keys
	offByOne              // reports Remaining one too high
	noRetryAfter          // denies with RetryAfter 0
	racy                  // reads and writes the count in two critical sections
	refundAboveLimit      // Refund can raise the count below zero
	sharedKeys            // every limiter shares one table
	truncatesKeys         // counts keys by their first 8 bytes
	denialTakes           // a denial takes the cost anyway
	lateRetry             // RetryAfter one second too early
	noResetErrors         // Reset accepts an empty key
	peekTakes             // Peek takes the cost
	stuckWindow           // the window never ends
	refundsTwice          // Refund gives back twice the cost
	rateAsPolicy          // advertises the refill rate per second, not the quota
	longWindow            // advertises a window one second too long
)

var shared = struct {
	sync.Mutex
	m map[string]*window
}{m: map[string]*window{}}

type window struct {
	start time.Time
	used  int64
}

// fixed is a fixed-window limiter in memory on a fake clock: correct with
// flaw none, broken as its flaw says otherwise.
type fixed struct {
	mu    sync.Mutex
	cfg   limitertest.Config
	now   func() time.Time
	flaw  flaw
	state map[string]*window
}

func (f *fixed) table() map[string]*window {
	if f.flaw == sharedKeys {
		return shared.m
	}
	return f.state
}

func (f *fixed) validate(req ratekit.Request) error {
	if f.flaw == acceptsEmptyKey && req.Key == "" {
		return nil
	}
	if err := req.Validate(); err != nil {
		return err
	}
	if req.Cost > f.cfg.Quota {
		return ratekit.ErrCostExceedsQuota
	}
	return nil
}

func (f *fixed) win(key string) *window {
	if f.flaw == truncatesKeys && len(key) > 8 {
		key = key[:8]
	}
	now := f.now()
	w := f.table()[key]
	if w == nil || (f.flaw != stuckWindow && !now.Before(w.start.Add(f.cfg.Window))) {
		w = &window{start: now.Truncate(f.cfg.Window)}
		f.table()[key] = w
	}
	return w
}

func (f *fixed) decision(w *window, allowed bool) ratekit.Decision {
	reset := w.start.Add(f.cfg.Window).Sub(f.now())
	d := ratekit.Decision{
		Allowed:    allowed,
		Quota:      f.cfg.Quota,
		Remaining:  f.cfg.Quota - w.used,
		ResetAfter: reset,
		Policy:     ratekit.Policy{Name: f.cfg.Name, Quota: f.cfg.Quota, Window: f.cfg.Window},
	}
	switch f.flaw {
	case rateAsPolicy:
		d.Policy.Quota, d.Policy.Window = f.cfg.Quota*int64(time.Second)/int64(f.cfg.Window), time.Second
	case longWindow:
		d.Policy.Window += time.Second
	}
	if !allowed {
		d.RetryAfter = reset
		switch f.flaw {
		case noRetryAfter:
			d.RetryAfter = 0
		case lateRetry:
			d.RetryAfter = max(reset-time.Second, time.Microsecond)
		}
	}
	if f.flaw == offByOne && d.Remaining < d.Quota {
		d.Remaining++
	}
	return d
}

func (f *fixed) lock() func() {
	if f.flaw == sharedKeys {
		shared.Lock()
		return shared.Unlock
	}
	f.mu.Lock()
	return f.mu.Unlock
}

func (f *fixed) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	if err := f.validate(req); err != nil {
		return ratekit.Decision{}, err
	}
	unlock := f.lock()
	defer func() { unlock() }()
	w := f.win(req.Key)
	cost := req.Cost
	if f.flaw == ignoresCost {
		cost = 1
	}
	used := w.used
	if f.flaw == racy {
		// The lost-update race of a read-modify-write through a plain
		// key-value store, without a data race.
		unlock()
		runtime.Gosched()
		unlock = f.lock()
	}
	allowed := used+cost <= f.cfg.Quota || f.flaw == neverDenies
	if allowed || f.flaw == denialTakes {
		w.used = min(used+cost, f.cfg.Quota)
	}
	return f.decision(w, allowed), nil
}

func (f *fixed) Peek(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	if err := f.validate(req); err != nil {
		return ratekit.Decision{}, err
	}
	unlock := f.lock()
	defer unlock()
	w := f.win(req.Key)
	allowed := w.used+req.Cost <= f.cfg.Quota
	if f.flaw == peekTakes && allowed {
		w.used += req.Cost
	}
	return f.decision(w, allowed), nil
}

func (f *fixed) Refund(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	if err := f.validate(req); err != nil {
		return ratekit.Decision{}, err
	}
	unlock := f.lock()
	defer unlock()
	w := f.win(req.Key)
	w.used -= req.Cost
	if f.flaw == refundsTwice {
		w.used -= req.Cost
	}
	if f.flaw != refundAboveLimit {
		w.used = max(w.used, 0)
	}
	return f.decision(w, true), nil
}

func (f *fixed) Reset(ctx context.Context, key string) error {
	if f.flaw != noResetErrors {
		if err := ratekit.ValidateKey(key); err != nil {
			return err
		}
	}
	unlock := f.lock()
	defer unlock()
	delete(f.table(), key)
	return nil
}

func harness(fl flaw) limitertest.Harness {
	clock := fakeclock.New(time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC))
	return limitertest.Harness{
		New: func(t testing.TB, cfg limitertest.Config) ratekit.Limiter {
			return &fixed{cfg: cfg, now: clock.Now, flaw: fl, state: map[string]*window{}}
		},
		Advance:   clock.Add,
		Algorithm: ratekit.FixedWindow,
	}
}

// TestReferencePasses: a correct limiter passes every check.
func TestReferencePasses(t *testing.T) {
	limitertest.Run(t, harness(none))
}

// TestChecksCatchFlaws: for each flaw, the named check fails on a limiter
// that has it. This is what shows that the suite can fail.
func TestChecksCatchFlaws(t *testing.T) {
	checks := map[string]limitertest.Check{}
	for _, c := range limitertest.Checks() {
		checks[c.Name] = c
	}
	for _, tc := range []struct {
		flaw  flaw
		check string
	}{
		{ignoresCost, "CostN"},
		{neverDenies, "ExhaustExactly"},
		{acceptsEmptyKey, "Validation"},
		{offByOne, "FreshKey"},
		{noRetryAfter, "ExhaustExactly"},
		{racy, "Concurrency"},
		{refundAboveLimit, "Refund"},
		{sharedKeys, "PrefixIsolation"},
		{truncatesKeys, "KeyIsolation"},
		{denialTakes, "DenialTakesNothing"},
		{lateRetry, "Boundary"},
		{noResetErrors, "Reset"},
		{peekTakes, "Peek"},
		{stuckWindow, "FullReset"},
		{refundsTwice, "RefundRecipe"},
		{rateAsPolicy, "FreshKey"},
		{rateAsPolicy, "AdvertisedPolicy"},
		{longWindow, "AdvertisedPolicy"},
	} {
		t.Run(fmt.Sprintf("%s/flaw-%d", tc.check, tc.flaw), func(t *testing.T) {
			c, ok := checks[tc.check]
			if !ok {
				t.Fatalf("no check named %s", tc.check)
			}
			h := harness(tc.flaw)
			fails := false
			// A race shows only sometimes: give it a few tries.
			for i := 0; i < 20 && !fails; i++ {
				fails = c.Check(t, h) != nil
			}
			if !fails {
				t.Errorf("check %s passed a limiter with flaw %d", tc.check, tc.flaw)
			}
			if err := c.Check(t, harness(none)); err != nil {
				t.Errorf("check %s failed the reference limiter: %v", tc.check, err)
			}
		})
	}
}
