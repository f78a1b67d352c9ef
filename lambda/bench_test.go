package lambda_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/lambda"
)

// BenchmarkHTTPAPI measures what the adapter adds to an invocation, with a
// signed-window limiter and the client's token sent back: building the
// Request from the event, the Guard, and merging the response header
// fields. JSON decoding of the event is not included.
func BenchmarkHTTPAPI(b *testing.B) {
	c := newClock()
	a := adapter(b, lambda.Config{
		Guard: guard(b, httplimit.GuardConfig{Limiter: window(b, 1<<40, c), OnError: httplimit.FailClosed}),
		Key:   lambda.SourceIPKey(),
	})
	h := a.HTTPAPI(okHTTPAPI)
	var ev events.APIGatewayV2HTTPRequest
	if err := json.Unmarshal(fixture(b, "httpapi.json", nil), &ev); err != nil {
		b.Fatal(err)
	}
	resp, err := h(context.Background(), ev)
	if err != nil {
		b.Fatal(err)
	}
	ev.Headers["ratekit-token"] = single(resp.Headers, httplimit.DefaultStateHeader)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if resp, err := h(context.Background(), ev); err != nil || resp.StatusCode != 200 {
				b.Fatal(resp.StatusCode, err)
			}
		}
	})
}

// BenchmarkHTTPAPIBare is the same handler without the adapter, for the
// difference.
func BenchmarkHTTPAPIBare(b *testing.B) {
	var ev events.APIGatewayV2HTTPRequest
	if err := json.Unmarshal(fixture(b, "httpapi.json", nil), &ev); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if resp, err := okHTTPAPI(context.Background(), ev); err != nil || resp.StatusCode != 200 {
				b.Fatal(resp.StatusCode, err)
			}
		}
	})
}

// BenchmarkRootMiddleware is the same limiter and token behind the root
// net/http middleware, for comparison with BenchmarkHTTPAPI.
func BenchmarkRootMiddleware(b *testing.B) {
	c := newClock()
	mw, err := httplimit.Middleware(httplimit.MiddlewareConfig{
		GuardConfig: httplimit.GuardConfig{Limiter: window(b, 1<<40, c), OnError: httplimit.FailClosed},
		Key:         httplimit.RemoteAddrKey(),
	})
	if err != nil {
		b.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	req := httptest.NewRequest("POST", "/v1/quotes", nil)
	req.RemoteAddr = clientIP + ":443"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	req.Header.Set(httplimit.DefaultStateHeader, w.Header().Get(httplimit.DefaultStateHeader))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != 200 {
				b.Fatal(w.Code)
			}
		}
	})
}
