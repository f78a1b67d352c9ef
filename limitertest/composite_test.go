package limitertest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/fakeclock"
	"github.com/ratekit/ratekit/limitertest"
)

type compFlaw int

const (
	compNone         compFlaw = iota
	noRollback                // a later denial leaves what earlier policies took
	firstRetry                // RetryAfter of the first denying part, not the longest
	dropsBadParts             // parts of the wrong number are ignored
	partsUnderKey             // every part is counted under Request.Key
	refundsFirstOnly          // Refund gives back to the first policy only
)

// flawed is a composite over fixed-window parts, correct (ratekit.All)
// with compNone and broken as its flaw says otherwise.
type flawed struct {
	ratekit.Limiter // ratekit.All over parts
	parts           []*fixed
	flaw            compFlaw
}

func (f *flawed) Allow(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	switch f.flaw {
	case dropsBadParts:
		if len(req.Parts) != len(f.parts) {
			req.Parts = nil
		}
	case partsUnderKey:
		for i := range req.Parts {
			req.Parts[i].Key = req.Key
		}
	case noRollback:
		if err := req.Validate(); err != nil {
			return ratekit.Decision{}, err
		}
		ds := make([]ratekit.Decision, len(f.parts))
		for i, p := range f.parts {
			r := ratekit.Request{Key: req.Key, Cost: req.Cost}
			if req.Parts != nil {
				r.Key, r.Cost = req.Parts[i].Key, req.Parts[i].Cost
			}
			d, err := p.Allow(ctx, r)
			if err != nil {
				return d, err
			}
			ds[i] = d
		}
		return ratekit.Combine(ds), nil
	}
	d, err := f.Limiter.Allow(ctx, req)
	if f.flaw == firstRetry && !d.Allowed {
		for _, p := range d.Parts {
			if !p.Allowed {
				d.RetryAfter = p.RetryAfter
				break
			}
		}
	}
	return d, err
}

func (f *flawed) Peek(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	return f.Limiter.(ratekit.Peeker).Peek(ctx, req)
}

func (f *flawed) Refund(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	if f.flaw == refundsFirstOnly && req.Validate() == nil && req.Parts != nil && len(req.Parts) == len(f.parts) {
		d, err := f.Limiter.(ratekit.Peeker).Peek(ctx, req)
		if err != nil {
			return d, err
		}
		p, err := f.parts[0].Refund(ctx, ratekit.Request{Key: req.Parts[0].Key, Cost: req.Parts[0].Cost})
		d.Parts[0] = p
		return ratekit.Combine(d.Parts), err
	}
	return f.Limiter.(ratekit.Refunder).Refund(ctx, req)
}

func (f *flawed) Reset(ctx context.Context, key string) error {
	return f.Limiter.(ratekit.Resetter).Reset(ctx, key)
}

func compositeHarness(t testing.TB, fl compFlaw) limitertest.CompositeHarness {
	clock := fakeclock.New(time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC))
	build := func(t testing.TB, policies []limitertest.Config) ratekit.Limiter {
		f := &flawed{flaw: fl}
		ls := make([]ratekit.Limiter, len(policies))
		for i, cfg := range policies {
			p := &fixed{cfg: cfg, now: clock.Now, state: map[string]*window{}}
			f.parts = append(f.parts, p)
			ls[i] = p
		}
		all, err := ratekit.All(ls...)
		if err != nil {
			t.Fatal(err)
		}
		f.Limiter = all
		return f
	}
	return limitertest.CompositeHarness{New: build, Advance: clock.Add, Algorithm: ratekit.FixedWindow}
}

// TestCompositeReferencePasses: ratekit.All over correct limiters passes
// every composite check.
func TestCompositeReferencePasses(t *testing.T) {
	limitertest.RunComposite(t, compositeHarness(t, compNone))
}

// TestCompositeChecksCatchFlaws: for each flaw, the named composite check
// fails on a composite that has it.
func TestCompositeChecksCatchFlaws(t *testing.T) {
	checks := map[string]limitertest.CompositeCheck{}
	for _, c := range limitertest.CompositeChecks() {
		checks[c.Name] = c
	}
	for _, tc := range []struct {
		flaw  compFlaw
		check string
	}{
		{noRollback, "DenialTakesFromNone"},
		{noRollback, "Concurrency"},
		{firstRetry, "DenialTakesFromNone"},
		{dropsBadParts, "PartsValidation"},
		{partsUnderKey, "PartKeys"},
		{refundsFirstOnly, "Refund"},
	} {
		t.Run(fmt.Sprintf("%s/flaw-%d", tc.check, tc.flaw), func(t *testing.T) {
			c, ok := checks[tc.check]
			if !ok {
				t.Fatalf("no check named %s", tc.check)
			}
			if err := c.Check(t, compositeHarness(t, tc.flaw)); err == nil {
				t.Errorf("check %s passed a composite with flaw %d", tc.check, tc.flaw)
			} else {
				t.Logf("flaw %d: %v", tc.flaw, err)
			}
			if err := c.Check(t, compositeHarness(t, compNone)); err != nil {
				t.Errorf("check %s failed the reference composite: %v", tc.check, err)
			}
		})
	}
}
