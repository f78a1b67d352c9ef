// Package plannedtest holds the calendar scenarios of tokenbucket.Planned
// (month ends, 31st anchors, February in common and leap years, a
// daylight-saving change, plan upgrades, downgrades and refunds across
// them), so that every store runs the same table: memstore on a fake clock,
// and the Redis stores, whose clock cannot be faked, through Shifted.
package plannedtest

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/fakeclock"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// Shifted is a store for tests on a store whose clock is real (Redis): it
// adds to every period bound sent the real clock minus the fake one
// (Clock), and takes it off the store's Now in the results, so that a
// limiter whose period clock is Clock decides, on the store's real clock,
// in the periods of Clock's date. Token buckets are passed on unchanged and
// refill on the real clock. The shift is whole milliseconds, rounded down, so that bounds
// on whole milliseconds stay so for a store that reads its clock in
// milliseconds (Redis).
//
// The shift changes from call to call (the fake clock jumps, the real one
// runs), and the period records already written hold starts shifted by the
// shift of their call: before a call whose shift differs, Shifted calls
// Rebase with the difference in microseconds, which must add it to the
// start and the expiry of every period record of the test (and delete a
// record whose expiry is then past), so that the records stay where they
// were on the fake timeline. It is for one goroutine at a time.
type Shifted struct {
	kvstore.PeriodCounter
	Clock  func() time.Time
	Rebase func(ctx context.Context, delta int64) error

	last *int64 // the shift of the last call
}

// NewShifted returns a Shifted of store on clock with rebase.
func NewShifted(store kvstore.PeriodCounter, clock func() time.Time, rebase func(ctx context.Context, delta int64) error) Shifted {
	return Shifted{PeriodCounter: store, Clock: clock, Rebase: rebase, last: new(int64)}
}

// UpdateMulti implements kvstore.MultiAtomic with the shift.
func (s Shifted) UpdateMulti(ctx context.Context, group string, op kvstore.Op, updates []kvstore.Update, results []kvstore.OpResult) error {
	d := time.Since(s.Clock())
	shift := d.Milliseconds() // toward zero; down below, since d is usually negative (the fake clock runs ahead)
	if d%time.Millisecond < 0 {
		shift--
	}
	shift *= 1000
	if *s.last != 0 && shift != *s.last {
		if err := s.Rebase(ctx, shift-*s.last); err != nil {
			return err
		}
	}
	*s.last = shift
	moved := make([]kvstore.Update, len(updates))
	bounds := make([]kvstore.PeriodBounds, len(updates))
	for i, u := range updates {
		moved[i] = u
		if u.Period != nil {
			bounds[i] = *u.Period
			for j := range bounds[i].Bounds {
				bounds[i].Bounds[j] += shift
			}
			moved[i].Period = &bounds[i]
		}
	}
	if err := s.PeriodCounter.UpdateMulti(ctx, group, op, moved, results); err != nil {
		return err
	}
	for i := range results {
		if updates[i].Period != nil {
			results[i].Now -= shift
		}
	}
	return nil
}

// Limiter is what the scenarios need of tokenbucket.Planned.
type Limiter interface {
	ratekit.Limiter
	ratekit.Peeker
	ratekit.Refunder
	ratekit.Resetter
	Usage(ctx context.Context, key string) ([]ratekit.Usage, error)
}

// Plans is a settable plan per key, safe for concurrent use: its Plan
// method is a PlannedConfig.Plan.
type Plans struct {
	mu sync.Mutex
	m  map[string]ratekit.Plan
}

// Set makes plan the plan of key.
func (p *Plans) Set(key string, plan ratekit.Plan) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = make(map[string]ratekit.Plan)
	}
	p.m[key] = plan
}

// Plan returns the plan of key, or the zero Plan (which no strategy
// accepts) for a key without one.
func (p *Plans) Plan(_ context.Context, key string) (ratekit.Plan, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m[key], nil
}

// Op is what a step does.
type Op int

// The steps.
const (
	Allow Op = iota + 1
	Peek
	Refund
	Usage
	SetPlan
)

// Step is one step of a scenario, at an instant of the fake clock.
type Step struct {
	At   time.Time
	Op   Op
	Cost int64
	Plan ratekit.Plan // for SetPlan

	// Want, for Allow, Peek and Refund, the part of the Decision of
	// policy Part; for Usage, of its usage.
	Part      int
	Allowed   bool
	Remaining int64
	Used      int64 // Usage only
	Reset     time.Time
	Window    time.Duration // 0: not checked
}

// Scenario is a named list of steps on one key.
type Scenario struct {
	Name  string
	Steps []Step
}

// utc returns the UTC instant of the given wall clock.
func utc(y int, m time.Month, d, h, min int) time.Time {
	return time.Date(y, m, d, h, min, 0, 0, time.UTC)
}

// Monthly returns a plan of a monthly quota from anchor in loc (calendar
// months for the zero anchor) and a bucket of 1,000 a second, large
// enough not to interfere.
func Monthly(name string, quota int64, anchor time.Time, loc *time.Location) ratekit.Plan {
	return ratekit.Plan{Name: name, Policies: []ratekit.Policy{
		{Name: "monthly", Quota: quota, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Month, Location: loc, Anchor: anchor}},
		{Name: "burst", Quota: 1000, Window: time.Second, Algorithm: ratekit.TokenBucket},
	}}
}

// Scenarios returns the calendar scenarios. The first policy of every plan
// is the periodic one.
func Scenarios() []Scenario {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		panic(err)
	}
	a31 := utc(2027, time.January, 31, 10, 0)
	l31 := utc(2028, time.January, 31, 10, 0)
	free := Monthly("free", 5, utc(2027, time.May, 14, 9, 0), nil)
	pro := Monthly("pro", 100, utc(2027, time.May, 14, 9, 0), nil)
	day := ratekit.Plan{Name: "daily", Policies: []ratekit.Policy{{Name: "daily", Quota: 2, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Day, Location: berlin}}}}
	calendar := ratekit.Plan{Name: "calendar", Policies: []ratekit.Policy{{Name: "month", Quota: 2, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Month, Location: berlin}}}}
	hourly := ratekit.Plan{Name: "hourly", Policies: []ratekit.Policy{{Name: "hour", Quota: 2, Window: time.Hour, Algorithm: ratekit.FixedWindow}}}
	slowBurst := func(burst int64) ratekit.Plan {
		return ratekit.Plan{Name: "burst", Policies: []ratekit.Policy{
			{Name: "monthly", Quota: 100, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Month}},
			{Name: "burst", Quota: burst, Window: time.Duration(burst) * time.Hour, Algorithm: ratekit.TokenBucket},
		}}
	}
	return []Scenario{{
		Name: "31st anchor through February 2027",
		Steps: []Step{
			{At: a31, Op: SetPlan, Plan: Monthly("m", 3, a31, nil)},
			{At: a31, Op: Allow, Cost: 3, Allowed: true, Remaining: 0, Reset: utc(2027, time.February, 28, 10, 0), Window: 28 * 24 * time.Hour},
			{At: utc(2027, time.February, 28, 10, 0).Add(-time.Second), Op: Allow, Cost: 1, Allowed: false, Remaining: 0, Reset: utc(2027, time.February, 28, 10, 0)},
			{At: utc(2027, time.February, 28, 10, 0), Op: Allow, Cost: 1, Allowed: true, Remaining: 2, Reset: utc(2027, time.March, 31, 10, 0), Window: 31 * 24 * time.Hour},
			{At: utc(2027, time.March, 31, 9, 59), Op: Usage, Used: 1, Remaining: 2, Reset: utc(2027, time.March, 31, 10, 0)},
			{At: utc(2027, time.March, 31, 10, 0), Op: Allow, Cost: 2, Allowed: true, Remaining: 1, Reset: utc(2027, time.April, 30, 10, 0), Window: 30 * 24 * time.Hour},
			{At: utc(2027, time.April, 30, 10, 0), Op: Usage, Used: 0, Remaining: 3, Reset: utc(2027, time.May, 31, 10, 0)},
		},
	}, {
		Name: "31st anchor through February 2028, a leap year",
		Steps: []Step{
			{At: l31, Op: SetPlan, Plan: Monthly("m", 3, l31, nil)},
			{At: utc(2028, time.February, 29, 9, 0), Op: Allow, Cost: 3, Allowed: true, Remaining: 0, Reset: utc(2028, time.February, 29, 10, 0), Window: 29 * 24 * time.Hour},
			{At: utc(2028, time.February, 29, 10, 0), Op: Allow, Cost: 3, Allowed: true, Remaining: 0, Reset: utc(2028, time.March, 31, 10, 0), Window: 31 * 24 * time.Hour},
			{At: utc(2028, time.March, 1, 0, 0), Op: Peek, Cost: 1, Allowed: false, Remaining: 0, Reset: utc(2028, time.March, 31, 10, 0)},
		},
	}, {
		Name: "calendar days in Europe/Berlin across daylight-saving changes",
		Steps: []Step{
			{At: utc(2027, time.March, 28, 10, 0), Op: SetPlan, Plan: day},
			{At: utc(2027, time.March, 28, 10, 0), Op: Allow, Cost: 2, Allowed: true, Remaining: 0, Reset: utc(2027, time.March, 28, 22, 0), Window: 23 * time.Hour},
			{At: utc(2027, time.March, 28, 21, 59), Op: Allow, Cost: 1, Allowed: false, Remaining: 0, Reset: utc(2027, time.March, 28, 22, 0)},
			{At: utc(2027, time.March, 28, 22, 0), Op: Allow, Cost: 1, Allowed: true, Remaining: 1, Reset: utc(2027, time.March, 29, 22, 0), Window: 24 * time.Hour},
			{At: utc(2027, time.October, 31, 0, 0), Op: Allow, Cost: 2, Allowed: true, Remaining: 0, Reset: utc(2027, time.October, 31, 23, 0), Window: 25 * time.Hour},
			{At: utc(2027, time.October, 31, 22, 59), Op: Peek, Cost: 1, Allowed: false, Remaining: 0, Reset: utc(2027, time.October, 31, 23, 0)},
		},
	}, {
		Name: "calendar months in Europe/Berlin: March 2027 is an hour short",
		Steps: []Step{
			{At: utc(2027, time.February, 28, 22, 59), Op: SetPlan, Plan: calendar},
			{At: utc(2027, time.February, 28, 22, 59), Op: Allow, Cost: 2, Allowed: true, Remaining: 0, Reset: utc(2027, time.February, 28, 23, 0), Window: 28 * 24 * time.Hour},
			{At: utc(2027, time.February, 28, 23, 0), Op: Allow, Cost: 2, Allowed: true, Remaining: 0, Reset: utc(2027, time.March, 31, 22, 0), Window: 31*24*time.Hour - time.Hour},
		},
	}, {
		Name: "upgrade, downgrade and refunds within a period",
		Steps: []Step{
			{At: utc(2027, time.June, 1, 0, 0), Op: SetPlan, Plan: free},
			{At: utc(2027, time.June, 1, 0, 0), Op: Allow, Cost: 4, Allowed: true, Remaining: 1, Reset: utc(2027, time.June, 14, 9, 0)},
			{At: utc(2027, time.June, 2, 0, 0), Op: SetPlan, Plan: pro},
			{At: utc(2027, time.June, 2, 0, 0), Op: Usage, Used: 4, Remaining: 96, Reset: utc(2027, time.June, 14, 9, 0)},
			{At: utc(2027, time.June, 2, 0, 0), Op: Allow, Cost: 10, Allowed: true, Remaining: 86, Reset: utc(2027, time.June, 14, 9, 0)},
			{At: utc(2027, time.June, 3, 0, 0), Op: SetPlan, Plan: free},
			{At: utc(2027, time.June, 3, 0, 0), Op: Usage, Used: 14, Remaining: 0, Reset: utc(2027, time.June, 14, 9, 0)},
			{At: utc(2027, time.June, 3, 0, 0), Op: Allow, Cost: 1, Allowed: false, Remaining: 0, Reset: utc(2027, time.June, 14, 9, 0)},
			// A refund of the charge made under pro, now under free.
			{At: utc(2027, time.June, 4, 0, 0), Op: Refund, Cost: 10, Allowed: true, Remaining: 1, Reset: utc(2027, time.June, 14, 9, 0)},
			{At: utc(2027, time.June, 4, 0, 0), Op: Allow, Cost: 2, Allowed: false, Remaining: 1, Reset: utc(2027, time.June, 14, 9, 0)},
			{At: utc(2027, time.June, 4, 0, 0), Op: Allow, Cost: 1, Allowed: true, Remaining: 0, Reset: utc(2027, time.June, 14, 9, 0)},
			// The downgrade granted no fresh period: the next one starts
			// on the anchor's day, from zero.
			{At: utc(2027, time.June, 14, 9, 0), Op: Allow, Cost: 5, Allowed: true, Remaining: 0, Reset: utc(2027, time.July, 14, 9, 0), Window: 30 * 24 * time.Hour},
		},
	}, {
		Name: "a refund after its period ended never drives the count below zero",
		Steps: []Step{
			{At: utc(2027, time.July, 1, 0, 0), Op: SetPlan, Plan: free},
			{At: utc(2027, time.July, 1, 0, 0), Op: Allow, Cost: 3, Allowed: true, Remaining: 2, Reset: utc(2027, time.July, 14, 9, 0)},
			{At: utc(2027, time.July, 14, 9, 0), Op: Allow, Cost: 1, Allowed: true, Remaining: 4, Reset: utc(2027, time.August, 14, 9, 0)},
			{At: utc(2027, time.July, 15, 0, 0), Op: Refund, Cost: 3, Allowed: true, Remaining: 5, Reset: utc(2027, time.August, 14, 9, 0)},
			{At: utc(2027, time.July, 15, 0, 0), Op: Usage, Used: 0, Remaining: 5, Reset: utc(2027, time.August, 14, 9, 0)},
		},
	}, {
		Name: "a bucket whose burst changes with the plan starts full; the period count stays",
		Steps: []Step{
			{At: utc(2027, time.August, 3, 0, 0), Op: SetPlan, Plan: slowBurst(2)},
			{At: utc(2027, time.August, 3, 0, 0), Op: Allow, Cost: 2, Part: 1, Allowed: true, Remaining: 0},
			{At: utc(2027, time.August, 3, 0, 0), Op: Allow, Cost: 1, Part: 1, Allowed: false, Remaining: 0},
			{At: utc(2027, time.August, 3, 0, 0), Op: SetPlan, Plan: slowBurst(3)},
			{At: utc(2027, time.August, 3, 0, 0), Op: Allow, Cost: 1, Part: 1, Allowed: true, Remaining: 2},
			{At: utc(2027, time.August, 3, 0, 0), Op: Usage, Part: 0, Used: 3, Remaining: 97, Reset: utc(2027, time.September, 1, 0, 0)},
			{At: utc(2027, time.August, 3, 0, 0), Op: SetPlan, Plan: slowBurst(2)},
			{At: utc(2027, time.August, 3, 0, 0), Op: Peek, Cost: 1, Part: 1, Allowed: false, Remaining: 0},
		},
	}, {
		Name: "a fixed window without a period is aligned to the epoch",
		Steps: []Step{
			{At: utc(2027, time.September, 1, 10, 30), Op: SetPlan, Plan: hourly},
			{At: utc(2027, time.September, 1, 10, 30), Op: Allow, Cost: 2, Allowed: true, Remaining: 0, Reset: utc(2027, time.September, 1, 11, 0), Window: time.Hour},
			{At: utc(2027, time.September, 1, 10, 59), Op: Allow, Cost: 1, Allowed: false, Remaining: 0, Reset: utc(2027, time.September, 1, 11, 0)},
			{At: utc(2027, time.September, 1, 11, 0), Op: Allow, Cost: 1, Allowed: true, Remaining: 1, Reset: utc(2027, time.September, 1, 12, 0)},
		},
	}}
}

// Run runs every scenario, each on a key of its own, on a fake clock that
// starts at the first step: newLimiter returns the limiter under test for
// a clock (the period clock, and the store's clock where it can be set)
// and a plan func. A ResetAfter may be short of the one expected by up to
// slack: zero on a fake store clock, the time a decision takes through
// Shifted (whose store reads its clock after the shift was computed).
// Steps keep a second away from period boundaries for that reason.
func Run(t *testing.T, slack time.Duration, newLimiter func(t *testing.T, clock *fakeclock.Clock, plan func(context.Context, string) (ratekit.Plan, error)) Limiter) {
	for _, sc := range Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			clock := fakeclock.New(sc.Steps[0].At)
			plans := &Plans{}
			l := newLimiter(t, clock, plans.Plan)
			key := "key-" + sc.Name
			ctx := context.Background()
			for i, st := range sc.Steps {
				clock.Add(st.At.Sub(clock.Now()))
				runStep(t, ctx, l, plans, key, i, st, slack)
			}
		})
	}
}

// runStep runs step i of a scenario, st, on key, and fails t unless its
// outcome is the one st wants (a ResetAfter up to slack short).
func runStep(t *testing.T, ctx context.Context, l Limiter, plans *Plans, key string, i int, st Step, slack time.Duration) {
	t.Helper()
	var (
		d   ratekit.Decision
		err error
	)
	switch st.Op {
	case SetPlan:
		plans.Set(key, st.Plan)
		return
	case Usage:
		u, err := l.Usage(ctx, key)
		if err != nil {
			t.Fatalf("step %d: Usage: %v", i, err)
		}
		got := u[st.Part]
		if got.Used != st.Used || got.Remaining != st.Remaining || (!st.Reset.IsZero() && !near(got.ResetAfter, st.Reset.Sub(st.At), slack)) {
			t.Fatalf("step %d at %v: usage %+v; want Used %d, Remaining %d, reset at %v", i, st.At, got, st.Used, st.Remaining, st.Reset)
		}
		return
	case Allow:
		d, err = l.Allow(ctx, ratekit.Request{Key: key, Cost: st.Cost})
	case Peek:
		d, err = l.Peek(ctx, ratekit.Request{Key: key, Cost: st.Cost})
	case Refund:
		d, err = l.Refund(ctx, ratekit.Request{Key: key, Cost: st.Cost})
	}
	if err != nil {
		t.Fatalf("step %d at %v: %v", i, st.At, err)
	}
	checkDecision(t, i, st, d, slack)
}

// checkDecision fails t unless d, the decision of step i, is the one st
// wants (a ResetAfter up to slack short).
func checkDecision(t *testing.T, i int, st Step, d ratekit.Decision, slack time.Duration) {
	t.Helper()
	p := d.Parts[st.Part]
	if d.Allowed != st.Allowed || p.Allowed != st.Allowed || p.Remaining != st.Remaining {
		t.Fatalf("step %d at %v: decision %+v, part %+v; want Allowed %v, Remaining %d", i, st.At, d, p, st.Allowed, st.Remaining)
	}
	if !st.Reset.IsZero() {
		if want := st.Reset.Sub(st.At); !near(p.ResetAfter, want, slack) {
			t.Fatalf("step %d at %v: ResetAfter %v, want %v (until %v)", i, st.At, p.ResetAfter, want, st.Reset)
		}
		if !st.Allowed && p.RetryAfter != p.ResetAfter {
			t.Fatalf("step %d at %v: RetryAfter %v, want the period's end, %v", i, st.At, p.RetryAfter, p.ResetAfter)
		}
	}
	if st.Window != 0 && p.Policy.Window != st.Window {
		t.Fatalf("step %d at %v: Policy.Window %v, want %v", i, st.At, p.Policy.Window, st.Window)
	}
}

// near reports whether got is want or short of it by at most slack.
func near(got, want, slack time.Duration) bool { return got <= want && got >= want-slack }

// Race runs workers goroutines that each make perWorker Allow calls on key
// with costs cycling from 1 to maxCost, and returns the sum of the costs
// admitted and what Usage then reads as used by the key's first policy.
// Any error fails t.
func Race(t *testing.T, l Limiter, key string, workers, perWorker int, maxCost int64) (admitted, used int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWorker; i++ {
				cost := 1 + int64(w+i)%maxCost
				d, err := l.Allow(ctx, ratekit.Request{Key: key, Cost: cost})
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, err)
				case d.Allowed:
					admitted += cost
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d decisions failed, first: %v", len(errs), errs[0])
	}
	u, err := l.Usage(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	return admitted, u[0].Used
}

// BenchPlans returns the plan of the benchmarks, a burst and a monthly
// quota from a billing anchor, and the same two policies as buckets of a
// fixed tokenbucket.Composite would count them (the month as a bucket of
// its quota filled in 30 days), sized so that every decision admits.
func BenchPlans() (ratekit.Plan, []ratekit.Policy) {
	plan := ratekit.Plan{Name: "pro", Policies: []ratekit.Policy{
		{Name: "burst", Quota: 1_000_000, Window: time.Second, Algorithm: ratekit.TokenBucket},
		{Name: "monthly", Quota: 1_000_000_000, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Month, Anchor: time.Date(2026, 1, 14, 9, 0, 0, 0, time.UTC)}},
	}}
	return plan, []ratekit.Policy{plan.Policies[0], {Name: "monthly", Quota: 1_000_000_000, Window: 30 * 24 * time.Hour, Algorithm: ratekit.TokenBucket}}
}

// BenchAllow runs Allow of cost 1 on l from parallel goroutines over 1,024
// keys, reporting allocations; a denial or an error fails b.
func BenchAllow(b *testing.B, l ratekit.Limiter) {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		i := int(next.Add(1)) * 97
		for pb.Next() {
			i++
			d, err := l.Allow(ctx, ratekit.Request{Key: keys[i%len(keys)], Cost: 1})
			if err != nil || !d.Allowed {
				b.Errorf("Allow: %+v, %v", d, err)
				return
			}
		}
	})
}

// BenchPlanFunc returns a plan func that serves plan from memory, as a
// program would from a cache of its customers' plans: a sync.Map lookup.
func BenchPlanFunc(plan ratekit.Plan) func(context.Context, string) (ratekit.Plan, error) {
	var m sync.Map
	return func(_ context.Context, key string) (ratekit.Plan, error) {
		if p, ok := m.Load(key); ok {
			return p.(ratekit.Plan), nil
		}
		m.Store(key, plan)
		return plan, nil
	}
}

// Bench runs the sub-benchmarks of a planned decision on store: a burst
// and a monthly quota with a plan lookup (tokenbucket.Planned), and the
// same two policies in a fixed tokenbucket.Composite, both with Group on a
// partitioned store.
func Bench(b *testing.B, store kvstore.Store) {
	plan, fixed := BenchPlans()
	m, ok := store.(kvstore.MultiAtomic)
	group := ok && m.Partitioned()
	b.Run("Planned", func(b *testing.B) {
		l, err := tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Prefix: "bench", Store: store, Group: group, Plan: BenchPlanFunc(plan)})
		if err != nil {
			b.Fatal(err)
		}
		BenchAllow(b, l)
	})
	b.Run("Composite", func(b *testing.B) {
		buckets := make([]tokenbucket.Bucket, len(fixed))
		for i, p := range fixed {
			buckets[i] = tokenbucket.Bucket{Name: p.Name, Burst: p.Quota, RefillRate: tokenbucket.Rate{Tokens: p.Quota, Per: p.Window}}
		}
		l, err := tokenbucket.NewComposite(tokenbucket.CompositeConfig{Buckets: buckets, Mode: tokenbucket.Atomic, Store: store, Group: group})
		if err != nil {
			b.Fatal(err)
		}
		BenchAllow(b, l)
	})
}

// CheckConcurrent runs 8 goroutines on keys of a monthly quota through a
// tokenbucket.Planned on store (with Group set as group says): they admit
// exactly min(demand, quota), and Usage reads back the sum of the admitted
// costs; with costs of 1 to 3, at most the quota and at least 2 below it.
func CheckConcurrent(t *testing.T, store kvstore.Store, group bool) {
	t.Helper()
	plans := &Plans{}
	l, err := tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Prefix: "api", Store: store, Group: group, Plan: plans.Plan})
	if err != nil {
		t.Fatal(err)
	}
	plans.Set("k", Monthly("m", 50, time.Time{}, nil))
	if admitted, used := Race(t, l, "k", 8, 20, 1); admitted != 50 || used != 50 {
		t.Fatalf("admitted %d units, usage reads %d; want 50 and 50", admitted, used)
	}
	plans.Set("small", Monthly("m", 500, time.Time{}, nil))
	if admitted, used := Race(t, l, "small", 8, 20, 1); admitted != 160 || used != 160 {
		t.Fatalf("demand below the quota: admitted %d units, usage reads %d; want 160 and 160", admitted, used)
	}
	plans.Set("v", Monthly("m", 50, time.Time{}, nil))
	if admitted, used := Race(t, l, "v", 8, 20, 3); admitted > 50 || admitted < 48 || used != admitted {
		t.Fatalf("costs 1 to 3: admitted %d units, usage reads %d; want 48 to 50, and equal", admitted, used)
	}
}
