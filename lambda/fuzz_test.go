package lambda_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	awslambda "github.com/aws/aws-lambda-go/lambda"

	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/lambda"
)

// FuzzEvent sends events with arbitrary header fields, cookies and source
// addresses through aws-lambda-go's invoke path: the wrapper must never
// panic or fail the invocation, must answer 200 or 400 (the limit is never
// reached here), and must key by the API key exactly as the root package
// does whatever the case of the field name.
func FuzzEvent(f *testing.F) {
	f.Add("x-api-key", "tk_live_7Hq2mX9cR4vB8nL1", "ratekit_token=AQE", "198.51.100.7")
	f.Add("X-API-KEY", "Bearer abc", "a=b; c", "2001:db8::1")
	f.Add("x-api-key", "", "", "")
	f.Add("ratekit-token", "\x00\xff", "=;=;;", "not an ip")
	f.Add("cookie", "ratekit_token=x", "ratekit_token=y", "::ffff:192.0.2.1")
	rec := &recorder{}
	g, err := httplimit.NewGuard(httplimit.GuardConfig{Limiter: rec, OnError: httplimit.FailClosed})
	if err != nil {
		f.Fatal(err)
	}
	key, err := lambda.APIKeyHeaderKey("X-Api-Key")
	if err != nil {
		f.Fatal(err)
	}
	a, err := lambda.New(lambda.Config{Guard: g, Key: key, IdempotencyKey: lambda.HeaderValue("Idempotency-Key")})
	if err != nil {
		f.Fatal(err)
	}
	h := awslambda.NewHandler(a.HTTPAPI(okHTTPAPI))
	f.Fuzz(func(t *testing.T, name, value, cookie, sourceIP string) {
		ev := events.APIGatewayV2HTTPRequest{Headers: map[string]string{name: value}, Cookies: []string{cookie}}
		ev.RequestContext.HTTP.SourceIP = sourceIP
		payload, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		// What the function receives after JSON: invalid UTF-8 is replaced.
		var got events.APIGatewayV2HTTPRequest
		if err := json.Unmarshal(payload, &got); err != nil {
			t.Fatal(err)
		}
		rec.reqs = rec.reqs[:0]
		out, err := h.Invoke(context.Background(), payload)
		if err != nil {
			t.Fatalf("invoke: %v", err)
		}
		var resp events.APIGatewayV2HTTPResponse
		if err := json.Unmarshal(out, &resp); err != nil {
			t.Fatal(err)
		}
		var gotValue string
		for k, v := range got.Headers {
			if http.CanonicalHeaderKey(k) == "X-Api-Key" {
				gotValue = v
			}
		}
		want, werr := httplimit.APIKey(gotValue)
		switch {
		case werr != nil:
			if resp.StatusCode != 400 {
				t.Fatalf("no key: status %d", resp.StatusCode)
			}
		case resp.StatusCode != 200:
			t.Fatalf("status %d %s", resp.StatusCode, resp.Body)
		case rec.last(t).Key != want:
			t.Fatalf("key %q, want %q", rec.last(t).Key, want)
		}
	})
}
