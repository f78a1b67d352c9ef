package httplimit

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
)

func TestSetHeaders(t *testing.T) {
	policy := ratekit.Policy{Name: "contact-form", Quota: 5, Window: time.Minute}
	tests := []struct {
		name   string
		d      ratekit.Decision
		legacy bool
		want   http.Header
	}{
		{
			name: "allowed",
			d:    ratekit.Decision{Allowed: true, Quota: 5, Remaining: 3, ResetAfter: 41200 * time.Millisecond, Policy: policy},
			want: http.Header{
				"Ratelimit-Policy": {`"contact-form";q=5;w=60`},
				"Ratelimit":        {`"contact-form";r=3;t=42`},
			},
		},
		{
			name: "denied: t and Retry-After agree, rounded up",
			d:    ratekit.Decision{Quota: 5, Remaining: 0, RetryAfter: 9001 * time.Millisecond, ResetAfter: 9001 * time.Millisecond, Policy: policy},
			want: http.Header{
				"Ratelimit-Policy": {`"contact-form";q=5;w=60`},
				"Ratelimit":        {`"contact-form";r=0;t=10`},
				"Retry-After":      {"10"},
			},
		},
		{
			name: "denied with a sub-second wait still says 1",
			d:    ratekit.Decision{Quota: 5, RetryAfter: time.Millisecond, Policy: policy},
			want: http.Header{
				"Ratelimit-Policy": {`"contact-form";q=5;w=60`},
				"Ratelimit":        {`"contact-form";r=0;t=1`},
				"Retry-After":      {"1"},
			},
		},
		{
			name:   "legacy fields on request",
			d:      ratekit.Decision{Allowed: true, Quota: 100, Remaining: 99, ResetAfter: 30 * time.Second, Policy: ratekit.Policy{Name: "api", Quota: 100, Window: 1500 * time.Millisecond}},
			legacy: true,
			want: http.Header{
				"Ratelimit-Policy":      {`"api";q=100;w=2`},
				"Ratelimit":             {`"api";r=99;t=30`},
				"X-Ratelimit-Limit":     {"100"},
				"X-Ratelimit-Remaining": {"99"},
				"X-Ratelimit-Reset":     {"30"},
			},
		},
		{
			name: "no window: w omitted; negative values clamp to 0",
			d:    ratekit.Decision{Allowed: true, Quota: 1, Remaining: -2, ResetAfter: -time.Second, Policy: ratekit.Policy{Name: "x", Quota: 1}},
			want: http.Header{
				"Ratelimit-Policy": {`"x";q=1`},
				"Ratelimit":        {`"x";r=0;t=0`},
			},
		},
		{
			name: "quotes and backslashes are escaped",
			d:    ratekit.Decision{Allowed: true, Quota: 1, Policy: ratekit.Policy{Name: `a"b\c`, Quota: 1, Window: time.Second}},
			want: http.Header{
				"Ratelimit-Policy": {`"a\"b\\c";q=1;w=1`},
				"Ratelimit":        {`"a\"b\\c";r=0;t=0`},
			},
		},
		{
			name: "a name that is no sf-string omits the RateLimit fields",
			d:    ratekit.Decision{Quota: 1, RetryAfter: time.Second, Policy: ratekit.Policy{Name: "bad\nname", Quota: 1}},
			want: http.Header{"Retry-After": {"1"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{"Ratelimit": {"stale"}} // replaced, not appended to
			if _, ok := tt.want["Ratelimit"]; !ok {
				h = http.Header{}
			}
			SetHeaders(h, tt.d, tt.legacy)
			if !reflect.DeepEqual(h, tt.want) {
				t.Fatalf("SetHeaders:\n got %v\nwant %v", h, tt.want)
			}
		})
	}
}

func TestDeniedProblem(t *testing.T) {
	d := ratekit.Decision{Quota: 5, RetryAfter: 2500 * time.Millisecond, Policy: ratekit.Policy{Name: "contact-form", Quota: 5, Window: time.Minute}}
	var p Problem
	if err := json.Unmarshal(DeniedProblem(d), &p); err != nil {
		t.Fatal(err)
	}
	want := Problem{
		Type:             ProblemTypeQuotaExceeded,
		Title:            p.Title,
		Status:           429,
		Detail:           "Retry in 3 s.",
		ViolatedPolicies: []string{"contact-form"},
	}
	if !reflect.DeepEqual(p, want) || p.Title == "" {
		t.Fatalf("DeniedProblem = %+v, want %+v", p, want)
	}
}

// TestRateLimitT: t is the time until more quota comes: a token bucket's
// next whole unit (0 when full), a window's end, a denial's RetryAfter.
func TestRateLimitT(t *testing.T) {
	bucket := ratekit.Policy{Name: "b", Quota: 20, Window: 4 * time.Second, Algorithm: ratekit.TokenBucket} // 5 a second
	window := ratekit.Policy{Name: "w", Quota: 20, Window: time.Hour, Algorithm: ratekit.FixedWindow}
	for _, tt := range []struct {
		name string
		d    ratekit.Decision
		want string
	}{
		{"bucket full", ratekit.Decision{Allowed: true, Quota: 20, Remaining: 20, Policy: bucket}, `"b";r=20;t=0`},
		{"bucket one short", ratekit.Decision{Allowed: true, Quota: 20, Remaining: 19, ResetAfter: 200 * time.Millisecond, Policy: bucket}, `"b";r=19;t=1`},
		// 15.5 units: full in 900ms, the 16th unit in 100ms.
		{"bucket half a unit short", ratekit.Decision{Allowed: true, Quota: 20, Remaining: 15, ResetAfter: 900 * time.Millisecond, Policy: bucket}, `"b";r=15;t=1`},
		// Empty: full in 4s, the first unit in 200ms.
		{"bucket empty", ratekit.Decision{Allowed: true, Quota: 20, Remaining: 0, ResetAfter: 4 * time.Second, Policy: bucket}, `"b";r=0;t=1`},
		// 2.33 of 20 a minute (a unit every 3s): full in 53s, the third unit in 2s.
		{"slow bucket", ratekit.Decision{Allowed: true, Quota: 20, Remaining: 2, ResetAfter: 53 * time.Second, Policy: ratekit.Policy{Name: "b", Quota: 20, Window: time.Minute, Algorithm: ratekit.TokenBucket}}, `"b";r=2;t=2`},
		{"bucket denied", ratekit.Decision{Allowed: false, Quota: 20, Remaining: 0, RetryAfter: 600 * time.Millisecond, ResetAfter: 4 * time.Second, Policy: bucket}, `"b";r=0;t=1`},
		{"window", ratekit.Decision{Allowed: true, Quota: 20, Remaining: 3, ResetAfter: 90 * time.Second, Policy: window}, `"w";r=3;t=90`},
		{"window denied", ratekit.Decision{Allowed: false, Quota: 20, Remaining: 0, RetryAfter: 90 * time.Second, ResetAfter: 90 * time.Second, Policy: window}, `"w";r=0;t=90`},
	} {
		h := http.Header{}
		SetHeaders(h, tt.d, false)
		if got := h.Get("RateLimit"); got != tt.want {
			t.Errorf("%s: RateLimit %q, want %q", tt.name, got, tt.want)
		}
		if !tt.d.Allowed && h.Get("Retry-After") != strconv.FormatInt(ceilSeconds(tt.d.RetryAfter), 10) {
			t.Errorf("%s: Retry-After %q", tt.name, h.Get("Retry-After"))
		}
	}
}

// TestCanonicalHeaderNames checks the canonical field names written out in
// headers.go against net/http.
func TestCanonicalHeaderNames(t *testing.T) {
	for name, canon := range map[string]string{
		HeaderRateLimitPolicy:     canonRateLimitPolicy,
		HeaderRateLimit:           canonRateLimit,
		HeaderRetryAfter:          canonRetryAfter,
		HeaderXRateLimitLimit:     canonXRateLimitLimit,
		HeaderXRateLimitRemaining: canonXRateLimitRemaining,
		HeaderXRateLimitReset:     canonXRateLimitReset,
	} {
		if want := http.CanonicalHeaderKey(name); canon != want {
			t.Errorf("canonical form of %q is %q, want %q", name, canon, want)
		}
	}
}
