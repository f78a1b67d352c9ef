package lambda_test

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/internal/extremes"
	"github.com/ratekit/ratekit/lambda"
)

// costLimiter admits every request of a valid cost up to its limit.
type costLimiter struct{ limit int64 }

func (l costLimiter) Allow(_ context.Context, req ratekit.Request) (ratekit.Decision, error) {
	if err := req.Validate(); err != nil {
		return ratekit.Decision{}, err
	}
	if req.Cost > l.limit {
		return ratekit.Decision{}, ratekit.ErrCostExceedsQuota
	}
	return ratekit.Decision{Allowed: true, Quota: l.limit, Remaining: l.limit - req.Cost, Policy: ratekit.Policy{Name: "p", Quota: l.limit, Window: time.Minute}}, nil
}

// TestConstructorExtremes feeds the numeric arguments of the package's
// constructors extreme values: ForwardedForKey (trustedProxies) returns a
// key function or an error matching ratekit.ErrInvalidConfig and never
// panics, and an adapter from New answers whatever its Cost function
// returns, admitting only valid costs.
func TestConstructorExtremes(t *testing.T) {
	g, err := httplimit.NewGuard(httplimit.GuardConfig{Limiter: costLimiter{5}, OnError: httplimit.FailClosed, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range extremes.Ints {
		var kf lambda.KeyFunc
		if extremes.Check(t, extremes.Name("ForwardedForKey", v), func() (err error) {
			kf, err = lambda.ForwardedForKey(int(v))
			return err
		}) {
			r := &lambda.Request{Header: http.Header{"X-Forwarded-For": {"192.0.2.1"}}}
			if _, err := kf(context.Background(), r); (err == nil) != (v == 1) {
				t.Errorf("ForwardedForKey(%d): %v", v, err)
			}
		}
		var a *lambda.Adapter
		if !extremes.Check(t, extremes.Name("New/Cost", v), func() (err error) {
			a, err = lambda.New(lambda.Config{Guard: g, Key: lambda.SourceIPKey(), Cost: func(*lambda.Request) int64 { return v }})
			return err
		}) {
			continue
		}
		h := a.HTTPAPI(func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
			return events.APIGatewayV2HTTPResponse{StatusCode: 200}, nil
		})
		ev := events.APIGatewayV2HTTPRequest{}
		ev.RequestContext.HTTP.SourceIP = "192.0.2.1"
		ev.RequestContext.HTTP.Method = "GET"
		resp, err := h(context.Background(), ev)
		if err != nil {
			t.Fatalf("cost %d: %v", v, err)
		}
		if ok := v >= 1 && v <= 5; ok != (resp.StatusCode == 200) {
			t.Errorf("cost %d: status %d", v, resp.StatusCode)
		}
	}
}
