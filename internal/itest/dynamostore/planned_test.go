package dynamostore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/internal/fakeclock"
	"github.com/ratekit/ratekit/internal/plannedtest"
	"github.com/ratekit/ratekit/internal/redistest"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
	"github.com/ratekit/ratekit/tokenbucket"
)

// plannedTable is a DynamoDB table of one test: stores on it each take a
// prefix of their own.
type plannedTable struct {
	client *dynamodb.Client
	name   string
}

// newPlannedTable creates a table for t on the test DynamoDB (dynalite on
// loopback unless RATEKIT_DYNAMODB_ENDPOINT names another) and deletes it
// when t ends.
func newPlannedTable(t *testing.T) plannedTable {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true // dynalite closes idle connections under a request (see dynamostore's tests)
	client := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(testenv.DynamoDBEndpoint(t)),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "ratekit planned test"}, nil
		}),
		HTTPClient: &http.Client{Transport: tr},
	})
	name := fmt.Sprintf("ratekit-planned-%d", time.Now().UnixNano())
	// dynalite has no Time to Live; the Store checks expiry itself.
	if err := dynamostore.CreateTable(context.Background(), client, name); err != nil && !errors.Is(err, dynamostore.ErrNoTTL) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(name)})
	})
	return plannedTable{client: client, name: name}
}

// store returns a Store on the table under a prefix of t's own, on clock
// now (nil: time.Now), with attempts enough for eight writers of one item.
func (tb plannedTable) store(t *testing.T, now func() time.Time) *dynamostore.Store {
	t.Helper()
	s, err := dynamostore.New(tb.client, dynamostore.Config{Table: tb.name, Prefix: redistest.Prefix(t), Now: now, MaxAttempts: 100})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newPlannedOn returns a tokenbucket.Planned with Group on store, whose
// period clock is now.
func newPlannedOn(t *testing.T, store kvstore.Store, now func() time.Time, plan func(context.Context, string) (ratekit.Plan, error)) *tokenbucket.Planned {
	t.Helper()
	p, err := tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Prefix: "api", Store: store, Group: true, Plan: plan, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPlannedCalendar runs tokenbucket.Planned's calendar scenarios on
// DynamoDB. DynamoDB has no clock: the store decides on the fake clock the
// periods are computed from (dynamostore.Config.Now), so every figure is
// exact to the microsecond.
func TestPlannedCalendar(t *testing.T) {
	tb := newPlannedTable(t)
	plannedtest.Run(t, 0, func(t *testing.T, c *fakeclock.Clock, plan func(context.Context, string) (ratekit.Plan, error)) plannedtest.Limiter {
		return newPlannedOn(t, tb.store(t, c.Now), c.Now, plan)
	})
}

// TestPlannedConcurrent: 8 goroutines on one key of a monthly quota admit
// exactly min(demand, quota), and Usage reads back the sum of the admitted
// costs. DynamoDB keeps a key's records in one item, so a Planned without
// Group is refused.
func TestPlannedConcurrent(t *testing.T) {
	s := newPlannedTable(t).store(t, nil)
	_, err := tokenbucket.NewPlanned(tokenbucket.PlannedConfig{Prefix: "api", Store: s, Plan: (&plannedtest.Plans{}).Plan})
	if !errors.Is(err, ratekit.ErrInvalidConfig) || !strings.Contains(err.Error(), "Group") {
		t.Fatalf("NewPlanned on dynamostore without Group: %v, want ratekit.ErrInvalidConfig naming Group", err)
	}
	plannedtest.CheckConcurrent(t, s, true)
}

// TestPlannedExtremes: plans of extreme quotas and windows are decided or
// refused as configuration errors, never a panic, a false clock skew or a
// store's range error.
func TestPlannedExtremes(t *testing.T) {
	plannedtest.CheckExtremes(t, newPlannedTable(t).store(t, nil))
}

// TestPlannedBadInput: what Planned refuses on DynamoDB is refused with the
// error every store gives, before anything is sent, and nothing is
// counted.
func TestPlannedBadInput(t *testing.T) {
	c := fakeclock.New(time.Date(2027, time.March, 10, 12, 0, 0, 0, time.UTC))
	plans := &plannedtest.Plans{}
	good := plannedtest.Monthly("pro", 10, time.Time{}, nil)
	plans.Set("k", good)
	plans.Set("sliding", ratekit.Plan{Name: "bad", Policies: []ratekit.Policy{{Name: "s", Quota: 5, Window: time.Minute, Algorithm: ratekit.SlidingWindow}}})
	l := newPlannedOn(t, newPlannedTable(t).store(t, c.Now), c.Now, plans.Plan)
	ctx := context.Background()
	long := strings.Repeat("x", ratekit.MaxKeyLen+1)
	for _, tc := range []struct {
		name string
		req  ratekit.Request
		want error
	}{
		{"empty key", ratekit.Request{Cost: 1}, ratekit.ErrEmptyKey},
		{"key too long", ratekit.Request{Key: long, Cost: 1}, ratekit.ErrKeyTooLong},
		{"idempotency key too long", ratekit.Request{Key: "k", Cost: 1, IdempotencyKey: long}, ratekit.ErrKeyTooLong},
		{"zero cost", ratekit.Request{Key: "k"}, ratekit.ErrInvalidCost},
		{"cost above the quota", ratekit.Request{Key: "k", Cost: 11}, ratekit.ErrCostExceedsQuota},
		{"cost above the quota, idempotent", ratekit.Request{Key: "k", Cost: 11, IdempotencyKey: "i"}, ratekit.ErrCostExceedsQuota},
		{"parts of the wrong length", ratekit.Request{Key: "k", Cost: 1, Parts: []ratekit.Part{{Key: "a", Cost: 1}, {Key: "b", Cost: 1}, {Key: "c", Cost: 1}}}, ratekit.ErrInvalidRequest},
		{"a plan Planned cannot count", ratekit.Request{Key: "sliding", Cost: 1}, ratekit.ErrInvalidConfig},
		{"a key with no plan", ratekit.Request{Key: "none", Cost: 1}, ratekit.ErrInvalidConfig},
	} {
		if _, err := l.Allow(ctx, tc.req); !errors.Is(err, tc.want) {
			t.Errorf("%s: Allow: %v, want %v", tc.name, err, tc.want)
		}
	}
	if u, err := l.Usage(ctx, "k"); err != nil || u[0].Used != 0 || u[0].Remaining != 10 {
		t.Fatalf("usage after refused requests: %+v, %v; want nothing used", u, err)
	}
	none := func(ratekit.PeriodUsage) error { return errors.New("a period reported") }
	if err := l.PeriodUsage(ctx, "monthly/x", time.Time{}, c.Now(), none); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Fatalf("PeriodUsage of an invalid policy name: %v, want ratekit.ErrInvalidConfig", err)
	}
	if err := l.PeriodUsage(ctx, "monthly", time.Time{}, c.Now().AddDate(1, 0, 0), none); err != nil {
		t.Fatalf("PeriodUsage after refused requests: %v, want no period", err)
	}
}

// TestPlannedIdempotency: on DynamoDB an admitted Allow or a Refund with an
// IdempotencyKey counts once, and its retry returns the first call's
// outcome, even from the next period; a refused Allow is not recorded, so
// its retry is decided afresh, as on PostgreSQL; a refund that carries the
// key of a charge of an ended period gives nothing back to the new one;
// PeriodUsage bills each period what was admitted less refunded; Reset
// leaves the idempotency records.
func TestPlannedIdempotency(t *testing.T) {
	start := time.Date(2027, time.January, 20, 12, 0, 0, 0, time.UTC)
	c := fakeclock.New(start)
	plans := &plannedtest.Plans{}
	plans.Set("k", ratekit.Plan{Name: "pro", Policies: []ratekit.Policy{
		{Name: "burst", Quota: 1000, Window: time.Second, Algorithm: ratekit.TokenBucket},
		{Name: "month", Quota: 10, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Month}},
	}})
	l := newPlannedOn(t, newPlannedTable(t).store(t, c.Now), c.Now, plans.Plan)
	ctx := context.Background()
	type step struct {
		advance time.Duration
		refund  bool
		cost    int64
		idem    string
		allowed bool
		left    int64 // the month's Remaining in the decision
		used    int64 // Usage's count of the current month after the step
	}
	jan, feb := time.Date(2027, time.February, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, time.March, 1, 0, 0, 0, 0, time.UTC)
	var first ratekit.Decision // of the first charge "a"
	for i, st := range []step{
		{cost: 3, idem: "a", allowed: true, left: 7, used: 3},
		{advance: time.Hour, cost: 3, idem: "a", allowed: true, left: 7, used: 3},  // retried: counted once, the first outcome
		{cost: 8, idem: "b", allowed: false, left: 7, used: 3},                     // refused: not recorded
		{refund: true, cost: 2, idem: "r", allowed: true, left: 9, used: 1},        // a refund
		{refund: true, cost: 2, idem: "r", allowed: true, left: 9, used: 1},        // retried: once
		{cost: 8, idem: "b", allowed: true, left: 1, used: 9},                      // the refused call's retry, decided afresh
		{cost: 1, idem: "c", allowed: true, left: 0, used: 10},                     // January ends with 10 used
		{cost: 8, idem: "b", allowed: true, left: 1, used: 10},                     // retried: the admitted outcome
		{advance: 15 * 24 * time.Hour, cost: 3, idem: "a", allowed: true, left: 7}, // in February, a retry of January's "a"
		{cost: 4, idem: "d", allowed: true, left: 6, used: 4},
		{refund: true, cost: 1, idem: "c", allowed: true, left: 6, used: 4}, // refund of January's charge: nothing in February
		{refund: true, cost: 2, idem: "d", allowed: true, left: 8, used: 2}, // refund of February's: given back
	} {
		c.Add(st.advance)
		req := ratekit.Request{Key: "k", Cost: st.cost, IdempotencyKey: st.idem}
		var d ratekit.Decision
		var err error
		if st.refund {
			d, err = l.Refund(ctx, req)
		} else {
			d, err = l.Allow(ctx, req)
		}
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if d.Allowed != st.allowed || d.Parts[1].Remaining != st.left {
			t.Fatalf("step %d (%+v): decision %+v; want Allowed %v, %d remaining in the month", i, st, d, st.allowed, st.left)
		}
		if i == 0 {
			first = d
		}
		if st.idem == "a" && (d.Parts[1].ResetAfter != first.Parts[1].ResetAfter || d.Parts[1].Policy.Window != 31*24*time.Hour) {
			t.Fatalf("step %d: retry of \"a\" resets after %v in a period of %v; want the first call's %v in January (31 days)",
				i, d.Parts[1].ResetAfter, d.Parts[1].Policy.Window, first.Parts[1].ResetAfter)
		}
		if st.used == 0 && i > 0 {
			continue
		}
		if u, err := l.Usage(ctx, "k"); err != nil || u[1].Used != st.used {
			t.Fatalf("step %d: usage %+v, %v; want %d used this month", i, u, err, st.used)
		}
	}
	if want := jan.Sub(start); first.Parts[1].ResetAfter != want {
		t.Fatalf("the first charge resets after %v, want %v", first.Parts[1].ResetAfter, want)
	}
	var got []ratekit.PeriodUsage
	err := l.PeriodUsage(ctx, "month", start.AddDate(0, -2, 0), feb, func(u ratekit.PeriodUsage) error {
		got = append(got, u)
		return nil
	})
	slices.SortFunc(got, func(a, b ratekit.PeriodUsage) int { return a.Start.Compare(b.Start) })
	want := []ratekit.PeriodUsage{
		{Key: "k", Start: time.Date(2027, time.January, 1, 0, 0, 0, 0, time.UTC), End: jan, Used: 10},
		{Key: "k", Start: jan, End: feb, Used: 2},
	}
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("PeriodUsage: %v, %v; want %v", got, err, want)
	}
	// Reset forgets the counts, not the idempotency records: a retry of
	// "d" after it counts nothing.
	if err := l.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if d, err := l.Allow(ctx, ratekit.Request{Key: "k", Cost: 4, IdempotencyKey: "d"}); err != nil || !d.Allowed || d.Parts[1].Remaining != 6 {
		t.Fatalf("retry of \"d\" after Reset: %+v, %v; want the first outcome, 6 remaining", d, err)
	}
	if u, err := l.Usage(ctx, "k"); err != nil || u[1].Used != 0 {
		t.Fatalf("usage after Reset and a retry: %+v, %v; want 0 used", u, err)
	}
}

// TestPlannedPeriodUsage: over three months, keys of different billing
// anchors (one counted through Parts) are billed, per period, the units
// admitted less refunded, and only the periods that start in [from, to);
// fn's error stops the call and is returned as is.
func TestPlannedPeriodUsage(t *testing.T) {
	start := time.Date(2027, time.April, 3, 8, 0, 0, 0, time.UTC)
	c := fakeclock.New(start)
	anchors := map[string]time.Time{
		"a": time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC),
		"b": time.Date(2026, time.January, 31, 9, 0, 0, 0, time.UTC),
		"c": time.Date(2026, time.March, 15, 0, 0, 0, 0, time.UTC),
	}
	plans := &plannedtest.Plans{}
	for k, a := range anchors {
		plans.Set(k, plannedtest.Monthly("pro", 1000, a, nil))
	}
	l := newPlannedOn(t, newPlannedTable(t).store(t, c.Now), c.Now, plans.Plan)
	ctx := context.Background()
	ledger := map[string]int64{} // key and period start → admitted less refunded
	line := func(key string) string {
		p := ratekit.Period{Unit: ratekit.Month, Anchor: anchors[key]}
		s, e := p.Bounds(c.Now())
		return fmt.Sprintf("%s %v %v", key, s.UTC(), e.UTC())
	}
	for day := 0; day < 90; day += 3 {
		c.Add(start.Add(time.Duration(day) * 24 * time.Hour).Sub(c.Now()))
		for i, k := range []string{"a", "b", "c"} {
			cost := int64(1 + (day+i)%4)
			if d, err := l.Allow(ctx, ratekit.Request{Key: k, Cost: cost}); err != nil || !d.Allowed {
				t.Fatalf("day %d, key %s: %+v, %v", day, k, d, err)
			}
			ledger[line(k)] += cost
			if day%9 == 0 {
				if _, err := l.Refund(ctx, ratekit.Request{Key: k, Cost: 1}); err != nil {
					t.Fatal(err)
				}
				ledger[line(k)]--
			}
		}
		// "c" also counts through Parts, its month for key "c-org".
		if _, err := l.Allow(ctx, ratekit.Request{Key: "c", Cost: 1, Parts: []ratekit.Part{{Key: "c-org", Cost: 2}, {Key: "c", Cost: 1}}}); err != nil {
			t.Fatal(err)
		}
		anchors["c-org"] = anchors["c"]
		ledger[line("c-org")] += 2
	}
	from, to := start.AddDate(0, -1, 0), c.Now().AddDate(0, 1, 0)
	var got []string
	err := l.PeriodUsage(ctx, "monthly", from, to, func(u ratekit.PeriodUsage) error {
		got = append(got, fmt.Sprintf("%s %v %v = %d", u.Key, u.Start, u.End, u.Used))
		return nil
	})
	var want []string
	for k, used := range ledger {
		want = append(want, fmt.Sprintf("%s = %d", k, used))
	}
	slices.Sort(got)
	slices.Sort(want)
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("PeriodUsage: %v\n%q\nwant\n%q", err, got, want)
	}
	// Only the periods that start in [from, to).
	mid := start.AddDate(0, 1, 0)
	var later int
	if err := l.PeriodUsage(ctx, "monthly", mid, to, func(u ratekit.PeriodUsage) error {
		if u.Start.Before(mid) || !u.Start.Before(to) {
			t.Errorf("period %+v starts outside [%v, %v)", u, mid, to)
		}
		later++
		return nil
	}); err != nil || later == 0 || later >= len(want) {
		t.Fatalf("PeriodUsage from %v: %d periods of %d, %v", mid, later, len(want), err)
	}
	stop := errors.New("stop")
	if err := l.PeriodUsage(ctx, "monthly", from, to, func(ratekit.PeriodUsage) error { return stop }); err != stop {
		t.Fatalf("PeriodUsage whose fn fails: %v, want fn's error as is", err)
	}
}

// BenchmarkPlannedAllow measures a decision of a burst and a monthly quota
// with a plan lookup (tokenbucket.Planned) against the same two policies in
// a fixed tokenbucket.Composite, both with Group (one item per key), on the
// test DynamoDB, from parallel goroutines over 1,024 keys.
func BenchmarkPlannedAllow(b *testing.B) {
	plannedtest.Bench(b, dynamoStore(b))
}
