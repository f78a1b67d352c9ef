package httplimit

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

var (
	burstPolicy = ratekit.Policy{Name: "burst", Quota: 10, Window: time.Second}
	dailyPolicy = ratekit.Policy{Name: "daily", Quota: 1000, Window: 24 * time.Hour}
)

func TestSetHeadersComposite(t *testing.T) {
	tests := []struct {
		name   string
		parts  []ratekit.Decision
		legacy bool
		want   http.Header
	}{
		{
			name: "both admit",
			parts: []ratekit.Decision{
				{Allowed: true, Quota: 10, Remaining: 9, ResetAfter: 100 * time.Millisecond, Policy: burstPolicy},
				{Allowed: true, Quota: 1000, Remaining: 998, ResetAfter: 50999500 * time.Millisecond, Policy: dailyPolicy},
			},
			legacy: true,
			want: http.Header{
				"Ratelimit-Policy":      {`"burst";q=10;w=1, "daily";q=1000;w=86400`},
				"Ratelimit":             {`"burst";r=9;t=1, "daily";r=998;t=51000`},
				"X-Ratelimit-Limit":     {"10"},
				"X-Ratelimit-Remaining": {"9"},
				"X-Ratelimit-Reset":     {"1"},
			},
		},
		{
			name: "the daily quota denies: its t is its RetryAfter, Retry-After the top level's",
			parts: []ratekit.Decision{
				{Allowed: true, Quota: 10, Remaining: 10, ResetAfter: 0, Policy: burstPolicy},
				{Allowed: false, Quota: 1000, Remaining: 0, RetryAfter: 3*time.Hour + 1, ResetAfter: 20 * time.Hour, Policy: dailyPolicy},
			},
			want: http.Header{
				"Ratelimit-Policy": {`"burst";q=10;w=1, "daily";q=1000;w=86400`},
				"Ratelimit":        {`"burst";r=10;t=0, "daily";r=0;t=10801`},
				"Retry-After":      {"10801"},
			},
		},
		{
			name: "a part whose name cannot be written is left out of both lists",
			parts: []ratekit.Decision{
				{Allowed: false, Quota: 10, Remaining: 0, RetryAfter: 400 * time.Millisecond, ResetAfter: time.Second, Policy: ratekit.Policy{Name: "bürst", Quota: 10, Window: time.Second}},
				{Allowed: true, Quota: 1000, Remaining: 990, ResetAfter: time.Hour, Policy: dailyPolicy},
			},
			want: http.Header{
				"Ratelimit-Policy": {`"daily";q=1000;w=86400`},
				"Ratelimit":        {`"daily";r=990;t=3600`},
				"Retry-After":      {"1"},
			},
		},
		{
			name: "no part can be written: the stale fields go",
			parts: []ratekit.Decision{
				{Allowed: true, Quota: 10, Remaining: 3, ResetAfter: time.Second, Policy: ratekit.Policy{Name: "a\x7f", Quota: 10}},
			},
			want: http.Header{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{"Ratelimit": {"stale"}, "Ratelimit-Policy": {"stale"}}
			SetHeaders(h, ratekit.Combine(tc.parts), tc.legacy)
			if !reflect.DeepEqual(h, tc.want) {
				t.Errorf("SetHeaders:\n got %v\nwant %v", h, tc.want)
			}
		})
	}
}

func TestDeniedProblemComposite(t *testing.T) {
	org := ratekit.Policy{Name: "org", Quota: 5000, Window: time.Minute}
	d := ratekit.Combine([]ratekit.Decision{
		{Allowed: false, Quota: 10, RetryAfter: 300 * time.Millisecond, ResetAfter: time.Second, Policy: burstPolicy},
		{Allowed: true, Quota: 1000, Remaining: 5, ResetAfter: time.Hour, Policy: dailyPolicy},
		{Allowed: false, Quota: 5000, Remaining: 1, RetryAfter: 30 * time.Second, ResetAfter: time.Minute, Policy: org},
	})
	var p Problem
	if err := json.Unmarshal(DeniedProblem(d), &p); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p.ViolatedPolicies, []string{"burst", "org"}) || p.Detail != "Retry in 30 s." || p.Status != 429 {
		t.Errorf("DeniedProblem = %+v, want violated-policies [burst org] and a wait of 30 s", p)
	}
}

// TestMiddlewareComposite: a composite behind Middleware answers with both
// policies in the fields, and its denial names the policy that denied.
func TestMiddlewareComposite(t *testing.T) {
	burst, daily := newWindowLimiter("burst", 2), newWindowLimiter("daily", 3)
	burst.resetIn, daily.resetIn = time.Second, 20*time.Hour
	l, err := ratekit.All(burst, daily)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := Middleware(MiddlewareConfig{
		GuardConfig: GuardConfig{Limiter: l, OnError: FailClosed, Logger: slog.New(slog.DiscardHandler)},
		Key:         func(*http.Request) (string, error) { return "api-key-1", nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := DecisionFromContext(r.Context())
		if len(d.Parts) != 2 {
			t.Errorf("the handler's decision has %d parts, want 2", len(d.Parts))
		}
	}))
	get := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		return rec
	}
	rec := get()
	if rec.Code != 200 ||
		rec.Header().Get("RateLimit-Policy") != `"burst";q=2;w=60, "daily";q=3;w=60` ||
		rec.Header().Get("RateLimit") != `"burst";r=1;t=1, "daily";r=2;t=72000` {
		t.Fatalf("first response: %d %v", rec.Code, rec.Header())
	}
	get()
	rec = get() // the burst quota is used up; daily (no Peeker) is not asked
	var p Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	if rec.Code != 429 || rec.Header().Get("Retry-After") != "1" || !reflect.DeepEqual(p.ViolatedPolicies, []string{"burst"}) ||
		rec.Header().Get("RateLimit") != `"burst";r=0;t=1` {
		t.Fatalf("third response: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	// The denial by the burst policy took nothing from the daily one.
	if daily.used["api-key-1"] != 2 {
		t.Errorf("daily quota used %d after two admissions and a denial, want 2", daily.used["api-key-1"])
	}
}

// Refund makes windowLimiter a Refunder, so that All takes it as a part.
func (l *windowLimiter) Refund(ctx context.Context, req ratekit.Request) (ratekit.Decision, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.used[req.Key] = max(l.used[req.Key]-req.Cost, 0)
	return ratekit.Decision{Allowed: true, Quota: l.policy.Quota, Remaining: l.policy.Quota - l.used[req.Key], ResetAfter: l.resetIn, Policy: l.policy}, nil
}

// TestMiddlewareParts: MiddlewareConfig.Parts gives each policy its own
// key ("2 per user and 3 per organisation"), and parts of the wrong number
// are answered with 400.
func TestMiddlewareParts(t *testing.T) {
	user, org := newWindowLimiter("user", 2), newWindowLimiter("org", 3)
	l, err := ratekit.All(user, org)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := Middleware(MiddlewareConfig{
		GuardConfig: GuardConfig{Limiter: l, OnError: FailClosed, Logger: slog.New(slog.DiscardHandler)},
		Key:         func(r *http.Request) (string, error) { return r.Header.Get("User"), nil },
		Parts: func(r *http.Request) []ratekit.Part {
			if r.Header.Get("Broken") != "" {
				return []ratekit.Part{{Key: "x", Cost: 1}}
			}
			return []ratekit.Part{{Key: r.Header.Get("User"), Cost: 1}, {Key: "org-7", Cost: 1}}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	codes := ""
	for _, u := range []string{"ann", "ann", "ann", "bob", "bob", "cid"} {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("User", u)
		h.ServeHTTP(rec, r)
		codes += " " + http.StatusText(rec.Code)
	}
	want := " OK OK Too Many Requests OK Too Many Requests Too Many Requests"
	if codes != want {
		t.Errorf("answers%s, want%s", codes, want)
	}
	if user.used["ann"] != 2 || user.used["bob"] != 1 || user.used["cid"] != 0 || org.used["org-7"] != 3 {
		t.Errorf("used: users %v, organisation %v", user.used, org.used)
	}
	rec := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("User", "dan")
	r.Header.Set("Broken", "1")
	h.ServeHTTP(rec, r)
	if rec.Code != http.StatusBadRequest {
		t.Errorf("one part for two policies: %d, want 400", rec.Code)
	}
}
