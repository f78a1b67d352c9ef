package ratekit_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/internal/extremes"
)

// countLimiter admits every request of a valid cost up to its limit and
// reports what it was asked.
type countLimiter struct{ limit int64 }

func (l countLimiter) Allow(_ context.Context, req ratekit.Request) (ratekit.Decision, error) {
	if err := req.Validate(); err != nil {
		return ratekit.Decision{}, err
	}
	if req.Cost > l.limit {
		return ratekit.Decision{}, ratekit.ErrCostExceedsQuota
	}
	return ratekit.Decision{Allowed: true, Quota: l.limit, Remaining: l.limit - req.Cost, Policy: ratekit.Policy{Name: "p", Quota: l.limit, Window: time.Minute}}, nil
}

// TestConstructorExtremes feeds the numeric fields and arguments of the
// root package's constructors extreme values: NewGuard and Middleware
// (Timeout, OnError), ForwardedForKey (trustedProxies). Each returns a value
// or an error matching ErrInvalidConfig and never panics; a middleware it
// returns answers requests whatever its Cost function returns.
func TestConstructorExtremes(t *testing.T) {
	values := append([]int64{}, extremes.Ints...)
	for _, d := range extremes.Durations {
		values = append(values, int64(d))
	}
	for _, v := range values {
		for name, set := range map[string]func(*httplimit.GuardConfig){
			"Timeout": func(c *httplimit.GuardConfig) { c.Timeout = time.Duration(v) },
			"OnError": func(c *httplimit.GuardConfig) { c.OnError = httplimit.FailurePolicy(v) },
			"Fallback": func(c *httplimit.GuardConfig) {
				c.OnError, c.Fallback, c.Timeout = httplimit.UseFallback, countLimiter{5}, time.Duration(v)
			},
		} {
			gc := httplimit.GuardConfig{Limiter: countLimiter{5}, OnError: httplimit.FailClosed, Logger: slog.New(slog.DiscardHandler)}
			set(&gc)
			extremes.Check(t, extremes.Name("NewGuard/"+name, v), func() error {
				_, err := httplimit.NewGuard(gc)
				return err
			})
			var mw func(http.Handler) http.Handler
			if !extremes.Check(t, extremes.Name("Middleware/"+name, v), func() (err error) {
				mw, err = httplimit.Middleware(httplimit.MiddlewareConfig{GuardConfig: gc, Key: httplimit.RemoteAddrKey(), Cost: func(*http.Request) int64 { return v }})
				return err
			}) {
				continue
			}
			h := mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
			w := httptest.NewRecorder()
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = "192.0.2.1:1000"
			h.ServeHTTP(w, r)
			if ok := v >= 1 && v <= 5; ok != (w.Code == http.StatusOK) {
				t.Errorf("%s=%d, cost %d: status %d", name, v, v, w.Code)
			}
		}
		extremes.Check(t, extremes.Name("ForwardedForKey", v), func() error {
			_, err := httplimit.ForwardedForKey(int(v))
			return err
		})
		if v >= 1 {
			if _, err := httplimit.ForwardedForClient([]string{"192.0.2.1"}, int(v)); (err == nil) != (v == 1) {
				t.Errorf("ForwardedForClient with %d trusted proxies: %v", v, err)
			}
		}
	}
}
