package planstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	awslambda "github.com/aws/aws-lambda-go/lambda"

	"github.com/ratekit/ratekit/examples/internal/plans"
	"github.com/ratekit/ratekit/httplimit"
)

// errUpstream is the downstream failure of the symbol FAIL.
var errUpstream = errors.New("upstream timeout")

// Run runs every check of the paid API against the handlers newHandler
// builds, each check with customers of its own.
func Run(t *testing.T, newHandler NewHandler) {
	for _, c := range []struct {
		name  string
		check func(*testing.T, NewHandler)
	}{
		{"Lambda", checkLambda},
		{"BurstAndMonthlyQuota", checkBurstAndMonthlyQuota},
		{"Plans", checkPlans},
		{"PlanChangeKeepsUsage", checkPlanChangeKeepsUsage},
		{"UsageIsSumOfAdmitted", checkUsageIsSumOfAdmitted},
		{"BillingDayOn31st", checkBillingDayOn31st},
	} {
		t.Run(c.name, func(t *testing.T) { c.check(t, newHandler) })
	}
}

// The Lambda path, through aws-lambda-go's invoke: authentication, charges,
// refunds on failed work and bad input, idempotent retries, and the 429.
func checkLambda(t *testing.T, newHandler NewHandler) {
	customer, other := Unique("customer"), Unique("other")
	var quotes atomic.Int32
	s := Default(customer + "," + other)
	s.Tiers.BurstWindow = time.Second
	s.Quote = func(ctx context.Context, symbol string) (float64, error) {
		quotes.Add(1)
		if symbol == "ACME" {
			return 12.5, nil
		}
		return quote(ctx, symbol)
	}
	h := newHandler(t, s)
	// left is the monthly quota's member of the RateLimit list (the
	// burst's comes first).
	left := func(r Result) string {
		members := strings.Split(r.Header.Get("RateLimit"), ", ")
		return members[len(members)-1]
	}

	for _, key := range []string{"", "invented-key"} {
		if r := Call(t, h, key, "ACME", ""); r.Status != 401 || left(r) != "" {
			t.Fatalf("key %q: %d %s", key, r.Status, r.Body)
		}
	}

	r := Call(t, h, customer, "ACME", "")
	wantPolicy := fmt.Sprintf(`"burst";q=50;w=1, "monthly";q=3;w=%d`, MonthSeconds(time.Time{}))
	if r.Status != 200 || r.Header.Get("RateLimit-Policy") != wantPolicy || !strings.HasPrefix(left(r), `"monthly";r=2;t=`) {
		t.Fatalf("first call: %d %v %s", r.Status, r.Header, r.Body)
	}
	var got struct {
		Symbol string
		Price  float64
		Left   int64 `json:"calls_left_this_month"`
	}
	if err := json.Unmarshal([]byte(r.Body), &got); err != nil || got.Symbol != "ACME" || got.Price != 12.5 || got.Left != 2 {
		t.Fatalf("body %s: %v", r.Body, err)
	}

	// Failed work and bad input are refunded: two more calls still leave 2.
	if r := Call(t, h, customer, "FAIL", "retry-1"); r.Status != 502 || !strings.HasPrefix(left(r), `"monthly";r=2;`) {
		t.Fatalf("failed work: %d %v %s", r.Status, r.Header, r.Body)
	}
	if r := Call(t, h, customer, "not a symbol", ""); r.Status != 400 || !strings.HasPrefix(left(r), `"monthly";r=2;`) {
		t.Fatalf("bad symbol: %d %s", r.Status, r.Body)
	}

	// A retried call with the same Idempotency-Key is charged once.
	for i := 0; i < 3; i++ {
		r := Call(t, h, customer, "ACME", "order-7")
		if r.Status != 200 || !strings.HasPrefix(left(r), `"monthly";r=1;`) {
			t.Fatalf("idempotent attempt %d: %d %s %s", i, r.Status, left(r), r.Body)
		}
	}
	r = Call(t, h, customer, "ACME", "")
	if r.Status != 200 || !strings.HasPrefix(left(r), `"monthly";r=0;`) {
		t.Fatalf("third charged call: %d %s", r.Status, left(r))
	}
	before := quotes.Load()
	r = Call(t, h, customer, "ACME", "")
	var p httplimit.Problem
	json.Unmarshal([]byte(r.Body), &p)
	if r.Status != 429 || r.Header.Get("Retry-After") == "" || p.Type != httplimit.ProblemTypeQuotaExceeded || quotes.Load() != before {
		t.Fatalf("over quota: %d %v %s (downstream called %d times)", r.Status, r.Header, r.Body, quotes.Load()-before)
	}
	// Another customer has a quota of its own.
	if r := Call(t, h, other, "ACME", ""); r.Status != 200 {
		t.Fatalf("other customer: %d %s", r.Status, r.Body)
	}
	// Routes other than the API's are 404, and /usage is authenticated.
	if r := Request(t, h, "GET", "/v1/quotes", customer, ""); r.Status != 404 {
		t.Fatalf("unknown route: %d %s", r.Status, r.Body)
	}
	if r := Request(t, h, "GET", "/usage", "invented-key", ""); r.Status != 401 {
		t.Fatalf("usage of an unknown key: %d %s", r.Status, r.Body)
	}
}

// The burst and the monthly quota decide together: a call past the burst
// is refused with both policies in the fields, names the burst as the
// violated policy, and takes nothing from the monthly quota.
func checkBurstAndMonthlyQuota(t *testing.T, newHandler NewHandler) {
	customer := Unique("customer")
	s := Default(customer)
	s.Tiers.Free = plans.Tier{Burst: 2, Quota: 5}
	h := newHandler(t, s)
	wantPolicy := fmt.Sprintf(`"burst";q=2;w=60, "monthly";q=5;w=%d`, MonthSeconds(time.Time{}))
	for i := 0; i < 2; i++ {
		if r := Call(t, h, customer, "ACME", ""); r.Status != 200 || r.Header.Get("RateLimit-Policy") != wantPolicy {
			t.Fatalf("call %d: %d %v %s", i+1, r.Status, r.Header, r.Body)
		}
	}
	r := Call(t, h, customer, "ACME", "")
	var p httplimit.Problem
	json.Unmarshal([]byte(r.Body), &p)
	if r.Status != 429 || len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != plans.BurstPolicy ||
		!strings.HasPrefix(r.Header.Get("RateLimit"), `"burst";r=0;t=`) ||
		!strings.Contains(r.Header.Get("RateLimit"), `, "monthly";r=3;t=`) || r.Header.Get("Retry-After") == "" {
		t.Fatalf("past the burst: %d %v %s", r.Status, r.Header, r.Body)
	}
	u := UsageOf(t, h, customer)
	if m := u.Policies[1]; m.Name != plans.MonthlyPolicy || m.Used != 2 || m.Remaining != 3 {
		t.Fatalf("monthly quota after the burst's denial: %+v; want 2 used, 3 left", m)
	}
}

// Each plan admits its own monthly quota, an enterprise customer its
// custom one, and advertises it; /usage reports it.
func checkPlans(t *testing.T, newHandler NewHandler) {
	free, pro, ent := Unique("free"), Unique("pro"), Unique("ent")
	s := Default(free + "," + pro + "=pro," + ent + "=enterprise:7")
	s.Tiers.Pro.Burst, s.Tiers.EnterpriseBurst = 60, 70
	h := newHandler(t, s)
	for _, tc := range []struct {
		key, plan    string
		burst, quota int64
	}{{free, plans.Free, 50, 3}, {pro, plans.Pro, 60, 5}, {ent, plans.Enterprise, 70, 7}} {
		if n := Admitted(t, h, tc.key, int(tc.quota)+1); n != int(tc.quota) {
			t.Fatalf("%s: %d admitted, want %d", tc.plan, n, tc.quota)
		}
		r := Call(t, h, tc.key, "ACME", "")
		if want := fmt.Sprintf(`"burst";q=%d;w=60, "monthly";q=%d;w=%d`, tc.burst, tc.quota, MonthSeconds(time.Time{})); r.Header.Get("RateLimit-Policy") != want {
			t.Fatalf("%s: RateLimit-Policy %q, want %q", tc.plan, r.Header.Get("RateLimit-Policy"), want)
		}
		u := UsageOf(t, h, tc.key)
		b, m := u.Policies[0], u.Policies[1]
		if u.Plan != tc.plan || b.Name != plans.BurstPolicy || b.Quota != tc.burst || b.PeriodStart != nil ||
			m.Name != plans.MonthlyPolicy || m.Quota != tc.quota || m.Used != tc.quota || m.Remaining != 0 ||
			m.PeriodStart == nil || m.PeriodEnd == nil || !m.Reset.Equal(*m.PeriodEnd) {
			t.Fatalf("%s: usage %+v %+v", tc.plan, b, m)
		}
		// Calendar months: from the 1st at 00:00 UTC to the next 1st.
		now := time.Now().UTC()
		if s, e := *m.PeriodStart, *m.PeriodEnd; s.Day() != 1 || s.Hour() != 0 || e.Day() != 1 || !e.Equal(s.AddDate(0, 1, 0)) || now.Before(s) || !now.Before(e) {
			t.Fatalf("%s: period %v to %v", tc.plan, s, e)
		}
	}
}

// A plan change takes effect on the next call and keeps what was used:
// an upgrade leaves the difference, a downgrade leaves nothing (never less)
// until the month ends and starts no new month, and the admin route
// refuses callers without the token.
func checkPlanChangeKeepsUsage(t *testing.T, newHandler NewHandler) {
	customer := Unique("customer")
	h := newHandler(t, Default(customer))
	monthly := func() plans.PolicyUsage { return UsageOf(t, h, customer).Policies[1] }

	if n := Admitted(t, h, customer, 4); n != 3 {
		t.Fatalf("free plan: %d of 4 admitted, want 3", n)
	}
	start := monthly()
	SetPlan(t, h, customer, plans.Pro, 0) // 5 a month
	if m := monthly(); m.Quota != 5 || m.Used != 3 || m.Remaining != 2 {
		t.Fatalf("after the upgrade: %+v, want 3 used and 2 left of 5", m)
	}
	if n := Admitted(t, h, customer, 3); n != 2 {
		t.Fatalf("pro plan: %d of 3 admitted, want 2", n)
	}
	SetPlan(t, h, customer, plans.Free, 0) // 3 a month, 5 used
	if m := monthly(); m.Quota != 3 || m.Used != 5 || m.Remaining != 0 || !m.PeriodStart.Equal(*start.PeriodStart) || !m.PeriodEnd.Equal(*start.PeriodEnd) {
		t.Fatalf("after the downgrade: %+v, want 5 used and 0 left of 3 in the month %v to %v", m, *start.PeriodStart, *start.PeriodEnd)
	}
	if r := Call(t, h, customer, "ACME", ""); r.Status != 429 || !strings.Contains(r.Header.Get("RateLimit"), `"monthly";r=0;`) {
		t.Fatalf("after the downgrade: %d %s", r.Status, r.Header.Get("RateLimit"))
	}
	SetPlan(t, h, customer, plans.Enterprise, 9)
	if m := monthly(); m.Quota != 9 || m.Used != 5 || m.Remaining != 4 {
		t.Fatalf("enterprise: %+v, want 5 used and 4 left of 9", m)
	}
	checkAdminRefusals(t, h, customer)
	if m := monthly(); m.Quota != 9 {
		t.Fatalf("refused changes changed the plan: %+v", m)
	}
	// Without an admin token the route does not exist.
	off := Default(customer)
	off.AdminToken = ""
	if r := Request(t, newHandler(t, off), "POST", "/admin/plan", "", `{"api_key":"`+customer+`","plan":"pro"}`); r.Status != 404 {
		t.Fatalf("admin route without a token configured: %d %s", r.Status, r.Body)
	}
}

// checkAdminRefusals checks the refusals of POST /admin/plan.
func checkAdminRefusals(t *testing.T, h awslambda.Handler, customer string) {
	for _, tc := range []struct {
		name, auth, body string
		status           int
	}{
		{"no token", "", `{"api_key":"` + customer + `","plan":"pro"}`, 401},
		{"wrong token", "Bearer admin-tokem", `{"api_key":"` + customer + `","plan":"pro"}`, 401},
		{"unknown plan", "Bearer " + AdminToken, `{"api_key":"` + customer + `","plan":"gold"}`, 400},
		{"enterprise without quota", "Bearer " + AdminToken, `{"api_key":"` + customer + `","plan":"enterprise"}`, 400},
		{"unknown field", "Bearer " + AdminToken, `{"api_key":"` + customer + `","plan":"pro","qouta":5}`, 400},
		{"unknown customer", "Bearer " + AdminToken, `{"api_key":"nobody","plan":"pro"}`, 404},
	} {
		r := CallWith(t, h, func(ev *events.APIGatewayV2HTTPRequest) {
			ev.RawPath, ev.RequestContext.HTTP.Method = "/admin/plan", "POST"
			if tc.auth != "" {
				ev.Headers["authorization"] = tc.auth
			}
			ev.Body = tc.body
		})
		if r.Status != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, r.Status, r.Body, tc.status)
		}
	}
}

// What /usage reports as used is the sum of the admitted calls' costs:
// concurrent calls, some of them refunded (failed downstream work), never
// show a figure other than the calls answered 200.
func checkUsageIsSumOfAdmitted(t *testing.T, newHandler NewHandler) {
	customer := Unique("customer")
	s := Default(customer)
	s.Tiers.Free = plans.Tier{Burst: 100, Quota: 25}
	h := newHandler(t, s)
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Go(func() {
			for i := 0; i < 5; i++ {
				symbol := "ACME"
				if i == 2 {
					symbol = "FAIL"
				}
				r := Call(t, h, customer, symbol, "")
				mu.Lock()
				statuses[r.Status]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	m := UsageOf(t, h, customer).Policies[1]
	if int(m.Used) != statuses[200] || m.Remaining != 25-m.Used || statuses[200]+statuses[429]+statuses[502] != 40 {
		t.Fatalf("answers %v; usage %+v: used must equal the 200s", statuses, m)
	}
	if statuses[200] > 25 {
		t.Fatalf("answers %v: more than the quota of 25 admitted", statuses)
	}
}

// A customer billed on the 31st gets months from the 31st, or the last day
// of shorter months, at the anchor's time: /usage and the RateLimit fields
// agree on the period.
func checkBillingDayOn31st(t *testing.T, newHandler NewHandler) {
	customer := Unique("customer")
	anchor := time.Date(2025, time.January, 31, 9, 30, 0, 0, time.UTC)
	h := newHandler(t, Default(customer+"=pro@"+anchor.Format(time.RFC3339)))
	r := Call(t, h, customer, "ACME", "")
	if want := fmt.Sprintf(`"monthly";q=5;w=%d`, MonthSeconds(anchor)); r.Status != 200 || !strings.HasSuffix(r.Header.Get("RateLimit-Policy"), want) {
		t.Fatalf("call: %d %q, want the policy %q", r.Status, r.Header.Get("RateLimit-Policy"), want)
	}
	m := UsageOf(t, h, customer).Policies[1]
	if m.Used != 1 || m.PeriodStart == nil || m.PeriodEnd == nil {
		t.Fatalf("usage %+v", m)
	}
	s, e, now := *m.PeriodStart, *m.PeriodEnd, time.Now()
	lastDay := func(t time.Time) int { return time.Date(t.Year(), t.Month()+1, 0, 0, 0, 0, 0, time.UTC).Day() }
	for _, b := range []time.Time{s, e} {
		if b.Day() != min(31, lastDay(b)) || b.Hour() != 9 || b.Minute() != 30 || b.Second() != 0 {
			t.Fatalf("period %v to %v: a bound is not on the 31st (or the month's last day) at 09:30 UTC", s, e)
		}
	}
	if next := time.Date(s.Year(), s.Month()+1, 1, 0, 0, 0, 0, time.UTC); e.Month() != next.Month() || now.Before(s) || !now.Before(e) {
		t.Fatalf("period %v to %v does not hold now (%v) or is not one month", s, e, now)
	}
	// The RateLimit field's t is the time to the period's end, in whole
	// seconds (rounded up).
	var r0, tSec int64
	if _, err := fmt.Sscanf(strings.Split(r.Header.Get("RateLimit"), ", ")[1], `"monthly";r=%d;t=%d`, &r0, &tSec); err != nil ||
		r0 != 4 || time.Duration(tSec)*time.Second < time.Until(e) || time.Duration(tSec)*time.Second > time.Until(e)+5*time.Second {
		t.Fatalf("RateLimit %q (%v), want r=4 and t about %v", r.Header.Get("RateLimit"), err, time.Until(e).Round(time.Second))
	}
}
