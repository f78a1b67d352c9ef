package ratekit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
)

func ExampleSetHeaders() {
	d := ratekit.Decision{
		Allowed:    false,
		Quota:      5,
		Remaining:  0,
		RetryAfter: 41500 * time.Millisecond,
		ResetAfter: 41500 * time.Millisecond,
		Policy:     ratekit.Policy{Name: "contact-form", Quota: 5, Window: time.Minute},
	}
	h := http.Header{}
	httplimit.SetHeaders(h, d, false)
	fmt.Println("RateLimit-Policy:", h.Get("RateLimit-Policy"))
	fmt.Println("RateLimit:", h.Get("RateLimit"))
	fmt.Println("Retry-After:", h.Get("Retry-After"))
	// Output:
	// RateLimit-Policy: "contact-form";q=5;w=60
	// RateLimit: "contact-form";r=0;t=42
	// Retry-After: 42
}

// quota is a toy Limiter that grants a fixed number of requests per key
// forever. Real code uses signedwindow, tokenbucket or durable.
type quota struct {
	policy ratekit.Policy
	used   map[string]int64
}

func (q *quota) Allow(_ context.Context, req ratekit.Request) (ratekit.Decision, error) {
	if err := req.Validate(); err != nil {
		return ratekit.Decision{}, err
	}
	d := ratekit.Decision{Quota: q.policy.Quota, Policy: q.policy, ResetAfter: q.policy.Window}
	if q.used[req.Key]+req.Cost > q.policy.Quota {
		d.RetryAfter = q.policy.Window
		return d, nil
	}
	q.used[req.Key] += req.Cost
	d.Allowed, d.Remaining = true, q.policy.Quota-q.used[req.Key]
	return d, nil
}

func ExampleMiddleware() {
	limiter := &quota{
		policy: ratekit.Policy{Name: "api", Quota: 2, Window: time.Minute},
		used:   map[string]int64{},
	}
	key, err := httplimit.APIKeyHeaderKey("Authorization")
	if err != nil {
		panic(err)
	}
	mw, err := httplimit.Middleware(httplimit.MiddlewareConfig{
		GuardConfig: httplimit.GuardConfig{
			Limiter: limiter,
			OnError: httplimit.FailClosed, // a paid API: no decision, no service
		},
		Key: key,
	})
	if err != nil {
		panic(err)
	}
	handler := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := httplimit.DecisionFromContext(r.Context())
		fmt.Fprintf(w, "hello, %d left", d.Remaining)
	}))

	for i := 0; i < 3; i++ {
		r := httptest.NewRequest("GET", "/v1/thing", nil)
		r.Header.Set("Authorization", "Bearer customer-123")
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("RateLimit"), w.Header().Values("Retry-After"))
	}
	// Output:
	// 200 "api";r=1;t=60 []
	// 200 "api";r=0;t=60 []
	// 429 "api";r=0;t=60 [60]
}

func ExampleForwardedForKey() {
	// One load balancer in front of the service appends the address it saw.
	key, err := httplimit.ForwardedForKey(1)
	if err != nil {
		panic(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	// The client wrote the first entry itself; only the last one is trusted.
	r.Header.Set("X-Forwarded-For", "10.9.9.9, 198.51.100.23")
	fmt.Println(key(r))
	// Output: ip:198.51.100.23 <nil>
}
