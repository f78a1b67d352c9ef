package durable_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/internal/pgengine"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
)

// storeAt returns a Store whose period bounds are computed at the client
// time at and shifted so that the database's real now is at: decisions
// then count in the periods of that date, on the database clock. Stores of
// later dates see the rows of earlier ones as earlier periods.
func storeAt(t testing.TB, at time.Time) *pgstore.Store {
	t.Helper()
	s := newStore(t, pgstoretest.PostgresURL(t), 4)
	(*pgengine.Store)(s).SetPeriodClock(func() time.Time { return at }, time.Since(at))
	return s
}

// near reports whether d is within 5 s below want (the database clock runs
// on while a test runs).
func near(d, want time.Duration) bool { return d <= want && d > want-5*time.Second }

func periodLimiter(t testing.TB, s *pgstore.Store, prefix string, quota int64, p ratekit.Period) *durable.Limiter {
	t.Helper()
	l, err := durable.New(durable.Config{Store: s, Policy: ratekit.Policy{Name: "monthly", Quota: quota, Algorithm: ratekit.FixedWindow, Period: p}, Prefix: prefix, Durability: durable.Logged})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func utc(y int, m time.Month, d, h, min int) time.Time {
	return time.Date(y, m, d, h, min, 0, 0, time.UTC)
}

// TestPeriodWindows decides at client dates across month ends, 31st
// anchors, February in common and leap years and daylight-saving changes:
// each decision reports the period's length as its Window and the time to
// the period's true end as its ResetAfter, computed on the database clock.
func TestPeriodWindows(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skip(err)
	}
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skip(err)
	}
	anchor31 := ratekit.Period{Unit: ratekit.Month, Anchor: utc(2025, time.January, 31, 9, 0)}
	cases := []struct {
		name string
		p    ratekit.Period
		at   time.Time
		end  time.Time
		len  time.Duration
	}{
		{"31st anchor in a leap February", anchor31, utc(2028, time.February, 29, 10, 0), utc(2028, time.March, 31, 9, 0), 31 * 24 * time.Hour},
		{"31st anchor before a leap February's last day", anchor31, utc(2028, time.February, 28, 10, 0), utc(2028, time.February, 29, 9, 0), 29 * 24 * time.Hour},
		{"31st anchor in a common February", anchor31, utc(2027, time.February, 27, 10, 0), utc(2027, time.February, 28, 9, 0), 28 * 24 * time.Hour},
		{"31st anchor in April", anchor31, utc(2027, time.April, 29, 10, 0), utc(2027, time.April, 30, 9, 0), 30 * 24 * time.Hour},
		{"31st anchor back on the 31st", anchor31, utc(2027, time.May, 1, 10, 0), utc(2027, time.May, 31, 9, 0), 31 * 24 * time.Hour},
		{"2100 February", ratekit.Period{Unit: ratekit.Month}, utc(2100, time.February, 28, 23, 0), utc(2100, time.March, 1, 0, 0), 28 * 24 * time.Hour},
		{"Berlin day of spring forward", ratekit.Period{Unit: ratekit.Day, Location: berlin}, time.Date(2027, time.March, 28, 12, 0, 0, 0, berlin), time.Date(2027, time.March, 29, 0, 0, 0, 0, berlin), 23 * time.Hour},
		{"Berlin October", ratekit.Period{Unit: ratekit.Month, Location: berlin}, time.Date(2027, time.October, 31, 12, 0, 0, 0, berlin), time.Date(2027, time.November, 1, 0, 0, 0, 0, berlin), 31*24*time.Hour + time.Hour},
		{"New York day of fall back", ratekit.Period{Unit: ratekit.Day, Location: ny}, time.Date(2027, time.November, 7, 12, 0, 0, 0, ny), time.Date(2027, time.November, 8, 0, 0, 0, 0, ny), 25 * time.Hour},
		{"New York March", ratekit.Period{Unit: ratekit.Month, Location: ny}, time.Date(2027, time.March, 31, 23, 0, 0, 0, ny), time.Date(2027, time.April, 1, 0, 0, 0, 0, ny), 31*24*time.Hour - time.Hour},
		{"week across the year's end", ratekit.Period{Unit: ratekit.Week}, utc(2027, time.January, 3, 23, 0), utc(2027, time.January, 4, 0, 0), 7 * 24 * time.Hour},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := storeAt(t, c.at)
			l := periodLimiter(t, s, pgstoretest.Prefix(t), 2, c.p)
			ctx := ctxT(t)
			for i := range 3 {
				d, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: 1})
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed != (i < 2) || d.Policy.Window != c.len || !near(d.ResetAfter, c.end.Sub(c.at)) {
					t.Fatalf("take %d: allowed %v, window %v, reset after %v; want %v, %v, %v", i, d.Allowed, d.Policy.Window, d.ResetAfter, i < 2, c.len, c.end.Sub(c.at))
				}
				if !d.Allowed && d.RetryAfter != d.ResetAfter {
					t.Fatalf("denied: retry after %v, reset after %v", d.RetryAfter, d.ResetAfter)
				}
			}
		})
	}
}

// TestPeriodPick checks that the database, not the client, picks the
// period: a client a minute before a month's end, on a database a minute
// after it, counts in the new month; a new period starts from zero; a
// client more than a period away fails with ErrClockSkew.
func TestPeriodPick(t *testing.T) {
	ctx := ctxT(t)
	prefix := pgstoretest.Prefix(t)
	month := ratekit.Period{Unit: ratekit.Month}
	feb := storeAt(t, utc(2028, time.February, 10, 12, 0))
	lf := periodLimiter(t, feb, prefix, 3, month)
	for range 3 {
		if d, err := lf.Allow(ctx, ratekit.Request{Key: "k", Cost: 1}); err != nil || !d.Allowed {
			t.Fatalf("february: %+v, %v", d, err)
		}
	}
	// Client on February 29 23:59, database on March 1 00:01.
	behind := newStore(t, pgstoretest.PostgresURL(t), 2)
	at := utc(2028, time.February, 29, 23, 59)
	(*pgengine.Store)(behind).SetPeriodClock(func() time.Time { return at }, time.Since(at.Add(2*time.Minute)))
	lm := periodLimiter(t, behind, prefix, 3, month)
	d, err := lm.Allow(ctx, ratekit.Request{Key: "k", Cost: 1})
	if err != nil || !d.Allowed || d.Remaining != 2 || d.Policy.Window != 31*24*time.Hour || !near(d.ResetAfter, 31*24*time.Hour-time.Minute) {
		t.Fatalf("march: %+v, %v; want a fresh March", d, err)
	}
	// The usage of February was moved aside, exactly.
	var got []durable.PeriodUsage
	err = lf.PeriodUsage(ctx, utc(2028, time.February, 1, 0, 0), utc(2028, time.February, 2, 0, 0), func(u durable.PeriodUsage) error {
		got = append(got, u)
		return nil
	})
	if err != nil || len(got) != 1 || got[0].Used != 3 || !got[0].Start.Equal(utc(2028, time.February, 1, 0, 0)) || !got[0].End.Equal(utc(2028, time.March, 1, 0, 0)) {
		t.Fatalf("period usage: %+v, %v", got, err)
	}
	// Clocks three days apart on a daily period.
	skewed := newStore(t, pgstoretest.PostgresURL(t), 2)
	(*pgengine.Store)(skewed).SetPeriodClock(func() time.Time { return time.Now().Add(72 * time.Hour) }, 0)
	daily := periodLimiter(t, skewed, prefix+"d", 3, ratekit.Period{Unit: ratekit.Day})
	if _, err := daily.Allow(ctx, ratekit.Request{Key: "k", Cost: 1}); !errors.Is(err, ratekit.ErrClockSkew) {
		t.Fatalf("skewed allow: %v, want ErrClockSkew", err)
	}
}

// TestPeriodRealClock decides a calendar day with no clock set: the real
// clocks of client and database agree.
func TestPeriodRealClock(t *testing.T) {
	s := newStore(t, pgstoretest.PostgresURL(t), 2)
	l := periodLimiter(t, s, pgstoretest.Prefix(t), 1, ratekit.Period{Unit: ratekit.Day})
	ctx := ctxT(t)
	d, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: 1})
	if err != nil || !d.Allowed || d.Policy.Window < 23*time.Hour {
		t.Fatalf("%+v, %v", d, err)
	}
	if d, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: 1}); err != nil || d.Allowed || d.RetryAfter <= 0 {
		t.Fatalf("%+v, %v", d, err)
	}
	if d, err := l.Refund(ctx, ratekit.Request{Key: "k", Cost: 1}); err != nil || d.Remaining != 1 {
		t.Fatalf("refund: %+v, %v", d, err)
	}
	if err := l.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPeriodComposite decides a burst and a monthly quota together, all or
// nothing, in one statement.
func TestPeriodComposite(t *testing.T) {
	s := storeAt(t, utc(2027, time.January, 31, 8, 0))
	p := pgstoretest.Prefix(t)
	ctx := ctxT(t)
	burst := newLimiter(t, s, ratekit.TokenBucket, "burst", p+"-b", 2, time.Hour)
	monthly := periodLimiter(t, s, p+"-m", 3, ratekit.Period{Unit: ratekit.Month, Anchor: utc(2026, time.October, 31, 9, 0)})
	c := newComposite(t, burst, monthly)
	for i := range 3 {
		d, err := c.Allow(ctx, ratekit.Request{Key: "k", Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != (i < 2) || len(d.Parts) != 2 || d.Parts[1].Policy.Window != 31*24*time.Hour || !near(d.Parts[1].ResetAfter, time.Hour) {
			t.Fatalf("take %d: %+v", i, d)
		}
	}
	// The burst denied the third: the monthly quota kept its unit.
	if r := remaining(t, monthly, "k"); r != 1 {
		t.Fatalf("monthly remaining %d, want 1", r)
	}
}

func TestPeriodConfig(t *testing.T) {
	s := newStore(t, pgstoretest.PostgresURL(t), 1)
	for name, pol := range map[string]ratekit.Policy{
		"window and period": {Name: "m", Quota: 1, Window: time.Hour, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Month}},
		"token bucket":      {Name: "m", Quota: 1, Algorithm: ratekit.TokenBucket, Period: ratekit.Period{Unit: ratekit.Month}},
		"no unit":           {Name: "m", Quota: 1, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Location: time.UTC}},
		"unknown unit":      {Name: "m", Quota: 1, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: 9}},
	} {
		if _, err := durable.New(durable.Config{Store: s, Policy: pol, Durability: durable.Logged}); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
}

// planner returns a Plan func that serves plans[key] (set with set).
type planner struct {
	mu    sync.Mutex
	plans map[string]ratekit.Plan
	err   error
}

func (p *planner) set(key string, plan ratekit.Plan) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.plans[key] = plan
}

func (p *planner) plan(_ context.Context, key string) (ratekit.Plan, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.plans[key], p.err
}

func tier(name string, burst, monthly int64, anchor time.Time) ratekit.Plan {
	return ratekit.Plan{Name: name, Policies: []ratekit.Policy{
		{Name: "burst", Quota: burst, Window: time.Hour, Algorithm: ratekit.TokenBucket},
		{Name: "monthly", Quota: monthly, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Month, Anchor: anchor}},
	}}
}

func newPlanned(t testing.TB, s *pgstore.Store, prefix string, pl *planner) *durable.Planned {
	t.Helper()
	p, err := durable.NewPlanned(durable.PlannedConfig{Store: s, Prefix: prefix, Durability: durable.Logged, Plan: pl.plan})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func usage(t testing.TB, p *durable.Planned, key string) []ratekit.Usage {
	t.Helper()
	u, err := p.Usage(ctxT(t), key)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestPlannedChanges upgrades and downgrades a key mid-period: what was used
// stays, an upgrade leaves more remaining, a downgrade reports zero and
// starts no fresh period, and a refund goes to the current plan's counts.
func TestPlannedChanges(t *testing.T) {
	anchor := utc(2026, time.March, 14, 9, 0)
	s := storeAt(t, utc(2027, time.June, 20, 12, 0))
	pl := &planner{plans: map[string]ratekit.Plan{"k": tier("pro", 100, 10, anchor)}}
	p := newPlanned(t, s, pgstoretest.Prefix(t), pl)
	ctx := ctxT(t)
	for range 8 {
		if d, err := p.Allow(ctx, ratekit.Request{Key: "k", Cost: 1}); err != nil || !d.Allowed {
			t.Fatalf("pro: %+v, %v", d, err)
		}
	}
	u := usage(t, p, "k")
	if u[1].Used != 8 || u[1].Remaining != 2 || u[1].Policy.Window != 30*24*time.Hour || !near(u[1].ResetAfter, utc(2027, time.July, 14, 9, 0).Sub(utc(2027, time.June, 20, 12, 0))) {
		t.Fatalf("pro usage: %+v", u)
	}
	// Downgrade to 5 a month: nothing remains, nothing is admitted, the
	// period is the same.
	pl.set("k", tier("free", 100, 5, anchor))
	d, err := p.Allow(ctx, ratekit.Request{Key: "k", Cost: 1})
	if err != nil || d.Allowed || d.Remaining != 0 || d.Parts[1].Remaining != 0 || !near(d.RetryAfter, utc(2027, time.July, 14, 9, 0).Sub(utc(2027, time.June, 20, 12, 0))) {
		t.Fatalf("free: %+v, %v", d, err)
	}
	if u := usage(t, p, "k"); u[1].Used != 8 || u[1].Remaining != 0 {
		t.Fatalf("free usage: %+v", u)
	}
	// A refund under the downgraded plan lowers the count, never raising
	// remaining above the quota.
	if d, err := p.Refund(ctx, ratekit.Request{Key: "k", Cost: 2}); err != nil || d.Parts[1].Remaining != 0 {
		t.Fatalf("refund under free: %+v, %v", d, err)
	}
	if u := usage(t, p, "k"); u[1].Used != 6 {
		t.Fatalf("after refund: %+v", u)
	}
	// Upgrade to 1,000: the 6 used stay.
	pl.set("k", tier("enterprise", 100, 1000, anchor))
	if d, err := p.Allow(ctx, ratekit.Request{Key: "k", Cost: 1}); err != nil || !d.Allowed || d.Parts[1].Remaining != 993 {
		t.Fatalf("enterprise: %+v, %v", d, err)
	}
	if d, err := p.Refund(ctx, ratekit.Request{Key: "k", Cost: 5000}); err != nil || d.Parts[1].Remaining != 1000 {
		t.Fatalf("refund above the quota: %+v, %v", d, err)
	}
}

// TestPlannedRefundAcrossPeriods: a refund with the idempotency key of a
// charge made in an ended period gives nothing to the current period;
// one without gives to the current period.
func TestPlannedRefundAcrossPeriods(t *testing.T) {
	prefix := pgstoretest.Prefix(t)
	anchor := utc(2026, time.January, 31, 0, 0)
	pl := &planner{plans: map[string]ratekit.Plan{"k": tier("pro", 100, 10, anchor)}}
	ctx := ctxT(t)
	feb := newPlanned(t, storeAt(t, utc(2027, time.February, 27, 12, 0)), prefix, pl)
	if d, err := feb.Allow(ctx, ratekit.Request{Key: "k", Cost: 3, IdempotencyKey: "job-1"}); err != nil || !d.Allowed {
		t.Fatalf("february: %+v, %v", d, err)
	}
	// The plan changes with the new period (February 28th, the anchor's
	// day clamped). The charge's record holds the database's real time:
	// the new period must start after it in the database's frame too,
	// half a second before the new store's now.
	time.Sleep(700 * time.Millisecond)
	pl.set("k", tier("team", 100, 20, anchor))
	mar := newPlanned(t, storeAt(t, utc(2027, time.February, 28, 0, 0).Add(500*time.Millisecond)), prefix, pl)
	if d, err := mar.Allow(ctx, ratekit.Request{Key: "k", Cost: 4}); err != nil || !d.Allowed || d.Parts[1].Remaining != 16 {
		t.Fatalf("march: %+v, %v", d, err)
	}
	if d, err := mar.Refund(ctx, ratekit.Request{Key: "k", Cost: 3, IdempotencyKey: "job-1"}); err != nil || d.Parts[1].Remaining != 16 {
		t.Fatalf("refund of a february charge: %+v, %v; want 16 remaining in March", d, err)
	}
	if d, err := mar.Refund(ctx, ratekit.Request{Key: "k", Cost: 1}); err != nil || d.Parts[1].Remaining != 17 {
		t.Fatalf("refund without a key: %+v, %v", d, err)
	}
	// February's usage stayed 3, March's is 3.
	sum := map[time.Month]int64{}
	err := mar.PeriodUsage(ctx, "monthly", utc(2027, time.January, 1, 0, 0), utc(2027, time.April, 1, 0, 0), func(u durable.PeriodUsage) error {
		sum[u.Start.Month()] += u.Used
		return nil
	})
	if err != nil || sum[time.January] != 3 {
		// The February charge counted in the period that started January
		// 31st.
		t.Fatalf("period usage %v, %v", sum, err)
	}
}

// TestPlannedConcurrent runs 8 goroutines of 60 decisions each on one key
// with a monthly quota of 300: exactly 300 admitted, and Usage and
// PeriodUsage read back the sum of admitted costs.
func TestPlannedConcurrent(t *testing.T) {
	at := utc(2027, time.August, 3, 12, 0)
	s := storeAt(t, at)
	pl := &planner{plans: map[string]ratekit.Plan{}}
	for _, k := range []string{"a", "b"} {
		pl.set(k, tier("pro", 1000, 300, utc(2026, time.May, 3, 0, 0)))
	}
	p := newPlanned(t, s, pgstoretest.Prefix(t), pl)
	ctx := ctxT(t)
	var admitted [2]atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				k, cost := g%2, int64(1+i%3)
				d, err := p.Allow(ctx, ratekit.Request{Key: []string{"a", "b"}[k], Cost: cost})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted[k].Add(cost)
				}
			}
		}()
	}
	wg.Wait()
	for k, key := range []string{"a", "b"} {
		u := usage(t, p, key)
		if got := admitted[k].Load(); u[1].Used != got || got > 300 || got < 298 {
			t.Errorf("%s: admitted %d, usage %+v", key, got, u[1])
		}
	}
	total := int64(0)
	err := p.PeriodUsage(ctx, "monthly", at.AddDate(0, -1, 0), at, func(u durable.PeriodUsage) error {
		total += u.Used
		return nil
	})
	if err != nil || total != admitted[0].Load()+admitted[1].Load() {
		t.Fatalf("period usage %d, %v; admitted %d", total, err, admitted[0].Load()+admitted[1].Load())
	}
}

func TestPlannedBadInput(t *testing.T) {
	s := newStore(t, pgstoretest.PostgresURL(t), 1)
	ctx := ctxT(t)
	fail := errors.New("billing service down")
	pl := &planner{plans: map[string]ratekit.Plan{
		"dup":    {Policies: []ratekit.Policy{{Name: "x", Quota: 1, Window: time.Second, Algorithm: ratekit.FixedWindow}, {Name: "x", Quota: 1, Window: time.Second, Algorithm: ratekit.FixedWindow}}},
		"window": {Policies: []ratekit.Policy{{Name: "m", Quota: 1, Window: time.Hour, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Month}}}},
		"unit":   {Policies: []ratekit.Policy{{Name: "m", Quota: 1, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: 7}}}},
		"long":   {Policies: []ratekit.Policy{{Name: "a-policy-name-long-enough-to-overflow-the-prefix-limit-xx", Quota: 1, Window: time.Second, Algorithm: ratekit.FixedWindow}}},
	}}
	p := newPlanned(t, s, pgstoretest.Prefix(t), pl)
	for _, key := range []string{"none", "dup", "window", "unit", "long"} {
		if _, err := p.Allow(ctx, ratekit.Request{Key: key, Cost: 1}); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", key, err)
		}
	}
	pl.set("ok", tier("pro", 5, 5, time.Time{}))
	if _, err := p.Allow(ctx, ratekit.Request{Key: "ok", Cost: 6}); !errors.Is(err, ratekit.ErrCostExceedsQuota) {
		t.Errorf("cost 6: %v", err)
	}
	if _, err := p.Allow(ctx, ratekit.Request{Key: "", Cost: 1}); !errors.Is(err, ratekit.ErrEmptyKey) {
		t.Errorf("empty key: %v", err)
	}
	pl.err = fail
	if _, err := p.Allow(ctx, ratekit.Request{Key: "ok", Cost: 1}); !errors.Is(err, fail) {
		t.Errorf("plan error: %v", err)
	}
	for _, cfg := range []durable.PlannedConfig{
		{Store: s, Prefix: "p", Durability: durable.Logged},
		{Store: s, Prefix: "", Durability: durable.Logged, Plan: pl.plan},
		{Store: s, Prefix: "p", Plan: pl.plan},
		{Prefix: "p", Durability: durable.Logged, Plan: pl.plan},
	} {
		if _, err := durable.NewPlanned(cfg); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// TestPlannedReset forgets a key's counts under its plan.
func TestPlannedReset(t *testing.T) {
	s := newStore(t, pgstoretest.PostgresURL(t), 2)
	pl := &planner{plans: map[string]ratekit.Plan{"k": tier("pro", 5, 5, time.Time{})}}
	p := newPlanned(t, s, pgstoretest.Prefix(t), pl)
	ctx := ctxT(t)
	if _, err := p.Allow(ctx, ratekit.Request{Key: "k", Cost: 5, IdempotencyKey: "i"}); err != nil {
		t.Fatal(err)
	}
	if err := p.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if d, err := p.Allow(ctx, ratekit.Request{Key: "k", Cost: 5, IdempotencyKey: "i"}); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after reset: %+v, %v", d, err)
	}
	if _, err := p.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
}
