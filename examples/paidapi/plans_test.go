package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	awslambda "github.com/aws/aws-lambda-go/lambda"

	"github.com/ratekit/ratekit/examples/internal/plans"
)

// request invokes h with testdata/event.json turned into method path, with
// apiKey (when not empty) and, for a body, the admin token "admin-token".
func request(t *testing.T, h awslambda.Handler, method, path, apiKey, body string) quoteResult {
	t.Helper()
	return callWith(t, h, func(ev *events.APIGatewayV2HTTPRequest) {
		ev.RawPath, ev.RequestContext.HTTP.Method, ev.RequestContext.HTTP.Path = path, method, path
		ev.QueryStringParameters, ev.RawQueryString = nil, ""
		delete(ev.Headers, "x-api-key")
		if apiKey != "" {
			ev.Headers["x-api-key"] = apiKey
		}
		if body != "" {
			ev.Headers["authorization"] = "Bearer admin-token"
			ev.Headers["content-type"] = "application/json"
			ev.Body = body
		}
	})
}

// usageOf returns the answer of GET /usage for apiKey, failing t unless it
// is a 200.
func usageOf(t *testing.T, h awslambda.Handler, apiKey string) plans.UsageReport {
	t.Helper()
	r := request(t, h, "GET", "/usage", apiKey, "")
	var u plans.UsageReport
	if err := json.Unmarshal([]byte(r.body), &u); r.status != 200 || err != nil || len(u.Policies) != 2 {
		t.Fatalf("GET /usage: %d %s (%v)", r.status, r.body, err)
	}
	return u
}

// setPlan changes apiKey's plan through POST /admin/plan, failing t unless
// it is a 200.
func setPlan(t *testing.T, h awslambda.Handler, apiKey, plan string, quota int64) {
	t.Helper()
	body, _ := json.Marshal(plans.PlanChange{APIKey: apiKey, Plan: plan, Quota: quota})
	if r := request(t, h, "POST", "/admin/plan", "", string(body)); r.status != 200 {
		t.Fatalf("POST /admin/plan %s: %d %s", body, r.status, r.body)
	}
}

// admitted makes n calls for apiKey and returns how many got 200; any
// answer other than 200 and 429 fails t.
func admitted(t *testing.T, h awslambda.Handler, apiKey string, n int) int {
	t.Helper()
	ok := 0
	for i := 0; i < n; i++ {
		switch r := call(t, h, apiKey, "ACME", ""); r.status {
		case 200:
			ok++
		case 429:
		default:
			t.Fatalf("call %d: %d %s", i, r.status, r.body)
		}
	}
	return ok
}

// Each plan admits its own monthly quota, an enterprise customer its
// custom one, and advertises it; /usage reports it.
func TestPlans(t *testing.T) {
	prefix := unique(t)
	free, pro, ent := "free-"+prefix, "pro-"+prefix, "ent-"+prefix
	store := testStore(t, prefix, free, pro, ent)
	a := testAPI(t, store, prefix, free+","+pro+"=pro,"+ent+"=enterprise:7", func(c *config) { c.tiers.Pro.Burst, c.tiers.EnterpriseBurst = 60, 70 })
	h := awslambda.NewHandler(a.handler)
	for _, tc := range []struct {
		key          string
		plan         string
		burst, quota int64
	}{{free, plans.Free, 50, 3}, {pro, plans.Pro, 60, 5}, {ent, plans.Enterprise, 70, 7}} {
		r := call(t, h, tc.key, "ACME", "")
		want := fmt.Sprintf(`"burst";q=%d;w=60, "monthly";q=%d;w=%d`, tc.burst, tc.quota, monthSeconds(time.Time{}))
		if r.status != 200 || r.headers.Get("RateLimit-Policy") != want {
			t.Fatalf("%s: %d %q, want 200 %q", tc.plan, r.status, r.headers.Get("RateLimit-Policy"), want)
		}
		if n := admitted(t, h, tc.key, int(tc.quota)+2); n != int(tc.quota)-1 {
			t.Fatalf("%s: %d more calls admitted, want %d", tc.plan, n, tc.quota-1)
		}
		u := usageOf(t, h, tc.key)
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
// an upgrade leaves the difference, a downgrade leaves nothing (never less),
// and the admin route refuses callers without the token.
func TestPlanChangeKeepsUsage(t *testing.T) {
	prefix := unique(t)
	customer := "customer-" + prefix
	store := testStore(t, prefix, customer)
	a := testAPI(t, store, prefix, customer, func(c *config) { c.adminToken = "admin-token" })
	h := awslambda.NewHandler(a.handler)
	monthly := func() plans.PolicyUsage { return usageOf(t, h, customer).Policies[1] }

	if n := admitted(t, h, customer, 4); n != 3 {
		t.Fatalf("free plan: %d of 4 admitted, want 3", n)
	}
	setPlan(t, h, customer, plans.Pro, 0) // 5 a month
	if m := monthly(); m.Quota != 5 || m.Used != 3 || m.Remaining != 2 {
		t.Fatalf("after the upgrade: %+v, want 3 used and 2 left of 5", m)
	}
	if n := admitted(t, h, customer, 3); n != 2 {
		t.Fatalf("pro plan: %d of 3 admitted, want 2", n)
	}
	setPlan(t, h, customer, plans.Free, 0) // 3 a month, 5 used
	if m := monthly(); m.Quota != 3 || m.Used != 5 || m.Remaining != 0 {
		t.Fatalf("after the downgrade: %+v, want 5 used and 0 left of 3", m)
	}
	if r := call(t, h, customer, "ACME", ""); r.status != 429 || !strings.Contains(r.headers.Get("RateLimit"), `"monthly";r=0;`) {
		t.Fatalf("after the downgrade: %d %s", r.status, r.headers.Get("RateLimit"))
	}
	setPlan(t, h, customer, plans.Enterprise, 9)
	if m := monthly(); m.Quota != 9 || m.Used != 5 || m.Remaining != 4 {
		t.Fatalf("enterprise: %+v, want 5 used and 4 left of 9", m)
	}

	for _, tc := range []struct {
		name, auth, body string
		status           int
	}{
		{"no token", "", `{"api_key":"` + customer + `","plan":"pro"}`, 401},
		{"wrong token", "Bearer admin-tokem", `{"api_key":"` + customer + `","plan":"pro"}`, 401},
		{"unknown plan", "Bearer admin-token", `{"api_key":"` + customer + `","plan":"gold"}`, 400},
		{"enterprise without quota", "Bearer admin-token", `{"api_key":"` + customer + `","plan":"enterprise"}`, 400},
		{"unknown field", "Bearer admin-token", `{"api_key":"` + customer + `","plan":"pro","qouta":5}`, 400},
		{"unknown customer", "Bearer admin-token", `{"api_key":"nobody","plan":"pro"}`, 404},
	} {
		r := callWith(t, h, func(ev *events.APIGatewayV2HTTPRequest) {
			ev.RawPath, ev.RequestContext.HTTP.Method = "/admin/plan", "POST"
			delete(ev.Headers, "x-api-key")
			if tc.auth != "" {
				ev.Headers["authorization"] = tc.auth
			}
			ev.Body = tc.body
		})
		if r.status != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, r.status, r.body, tc.status)
		}
	}
	if m := monthly(); m.Quota != 9 {
		t.Fatalf("refused changes changed the plan: %+v", m)
	}
	// Without an admin token the route does not exist.
	off := testAPI(t, store, prefix, customer, nil)
	if r := request(t, awslambda.NewHandler(off.handler), "POST", "/admin/plan", "", `{"api_key":"`+customer+`","plan":"pro"}`); r.status != 404 {
		t.Fatalf("admin route without a token configured: %d %s", r.status, r.body)
	}
}

// What /usage reports as used is the sum of the admitted calls' costs:
// concurrent calls, some of them refunded (failed downstream work), never
// show a figure other than the calls answered 200.
func TestUsageIsSumOfAdmitted(t *testing.T) {
	prefix := unique(t)
	customer := "customer-" + prefix
	store := testStore(t, prefix, customer)
	a := testAPI(t, store, prefix, customer, func(c *config) {
		c.tiers.Free = plans.Tier{Burst: 100, Quota: 25}
		c.quote = func(_ context.Context, symbol string) (float64, error) {
			if symbol == "FAIL" {
				return 0, errors.New("upstream timeout")
			}
			return 1, nil
		}
	})
	h := awslambda.NewHandler(a.handler)
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				symbol := "ACME"
				if i == 2 {
					symbol = "FAIL"
				}
				r := call(t, h, customer, symbol, "")
				mu.Lock()
				statuses[r.status]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	m := usageOf(t, h, customer).Policies[1]
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
func TestBillingDayOn31st(t *testing.T) {
	prefix := unique(t)
	customer := "customer-" + prefix
	store := testStore(t, prefix, customer)
	anchor := time.Date(2025, time.January, 31, 9, 30, 0, 0, time.UTC)
	a := testAPI(t, store, prefix, customer+"=pro@"+anchor.Format(time.RFC3339), nil)
	h := awslambda.NewHandler(a.handler)
	r := call(t, h, customer, "ACME", "")
	if want := fmt.Sprintf(`"monthly";q=5;w=%d`, monthSeconds(anchor)); r.status != 200 || !strings.HasSuffix(r.headers.Get("RateLimit-Policy"), want) {
		t.Fatalf("call: %d %q, want the policy %q", r.status, r.headers.Get("RateLimit-Policy"), want)
	}
	m := usageOf(t, h, customer).Policies[1]
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
	if _, err := fmt.Sscanf(strings.Split(r.headers.Get("RateLimit"), ", ")[1], `"monthly";r=%d;t=%d`, &r0, &tSec); err != nil ||
		r0 != 4 || time.Duration(tSec)*time.Second < time.Until(e) || time.Duration(tSec)*time.Second > time.Until(e)+5*time.Second {
		t.Fatalf("RateLimit %q (%v), want r=4 and t about %v", r.headers.Get("RateLimit"), err, time.Until(e).Round(time.Second))
	}
}
