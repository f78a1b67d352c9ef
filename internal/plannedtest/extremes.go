package plannedtest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/extremes"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// CheckExtremes feeds a tokenbucket.Planned on store plans of every
// algorithm it counts with extreme quotas and windows: each plan is
// decided or refused with an error matching ratekit.ErrInvalidConfig,
// never a panic nor another error (a false ratekit.ErrClockSkew, a store's
// range error); on a plan it decides, a take or peek above the quota is
// ratekit.ErrCostExceedsQuota and a refund of any size succeeds and leaves
// the whole quota remaining. On a partitioned store the limiter has Group.
func CheckExtremes(t *testing.T, store kvstore.Store) {
	plans := &Plans{}
	m, ok := store.(kvstore.MultiAtomic)
	group := ok && m.Partitioned() // DynamoDB: a decision's records in one item
	l, err := tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Prefix: "ext", Store: store, Group: group, Plan: plans.Plan})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var cases []ratekit.Policy
	for _, q := range extremes.Ints {
		for _, w := range extremes.Durations {
			cases = append(cases,
				ratekit.Policy{Name: "b", Quota: q, Window: w, Algorithm: ratekit.TokenBucket},
				ratekit.Policy{Name: "w", Quota: q, Window: w, Algorithm: ratekit.FixedWindow})
		}
		cases = append(cases, ratekit.Policy{Name: "d", Quota: q, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Day}})
	}
	for i, pol := range cases {
		key := fmt.Sprintf("k%d", i)
		plans.Set(key, ratekit.Plan{Name: "p", Policies: []ratekit.Policy{pol}})
		name := fmt.Sprintf("%v quota %d window %v", pol.Algorithm, pol.Quota, pol.Window)
		if !decidedOrRefused(t, name, func() error {
			_, err := l.Allow(ctx, ratekit.Request{Key: key, Cost: 1})
			return err
		}) {
			continue
		}
		for _, cost := range []int64{pol.Quota + 1, ratekit.MaxQuota + 1, math.MaxInt64} {
			if cost <= pol.Quota {
				continue
			}
			for op, f := range map[string]func(context.Context, ratekit.Request) (ratekit.Decision, error){"Allow": l.Allow, "Peek": l.Peek} {
				if _, err := f(ctx, ratekit.Request{Key: key, Cost: cost}); !errors.Is(err, ratekit.ErrCostExceedsQuota) {
					t.Errorf("%s: %s cost %d: %v, want ErrCostExceedsQuota", name, op, cost, err)
				}
			}
		}
		for _, cost := range []int64{pol.Quota, ratekit.MaxQuota, ratekit.MaxQuota + 1, math.MaxInt64} {
			d, err := l.Refund(ctx, ratekit.Request{Key: key, Cost: cost})
			if err != nil || d.Remaining != pol.Quota {
				t.Errorf("%s: Refund of %d: %+v, %v; want the whole quota remaining", name, cost, d, err)
			}
		}
	}
}

// decidedOrRefused calls decide in a subtest named name and fails it when
// decide panics or returns an error that does not match
// ratekit.ErrInvalidConfig. It returns whether decide returned no error.
// Unlike extremes.Check it bounds no allocation: the process-wide count
// would include the store client's own goroutines.
func decidedOrRefused(t *testing.T, name string, decide func() error) (ok bool) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		var err error
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("panic: %v", p)
				}
			}()
			err = decide()
		}()
		if err != nil && !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Fatalf("error %v does not match ratekit.ErrInvalidConfig", err)
		}
		ok = err == nil
	})
	return ok
}
