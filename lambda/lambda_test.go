package lambda_test

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	awslambda "github.com/aws/aws-lambda-go/lambda"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/internal/leakcheck"
	"github.com/ratekit/ratekit/lambda"
	"github.com/ratekit/ratekit/signedwindow"
)

const (
	clientIP  = "198.51.100.7"
	apiKey    = "tk_live_7Hq2mX9cR4vB8nL1"
	subject   = "7d1e4c52-3b8a-4f6e-9a0d-2c5b8e1f4a37"
	policy2   = `"api";q=2;w=60`
	problemCT = httplimit.ProblemContentType
)

func TestNewRefusesIncompleteConfig(t *testing.T) {
	g := guard(t, httplimit.GuardConfig{Limiter: &recorder{}, OnError: httplimit.FailClosed})
	for _, cfg := range []lambda.Config{{Key: lambda.SourceIPKey()}, {Guard: g}} {
		if _, err := lambda.New(cfg); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
	if _, err := lambda.ForwardedForKey(0); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Errorf("ForwardedForKey(0): %v", err)
	}
	if _, err := lambda.APIKeyHeaderKey("bad name"); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Errorf("APIKeyHeaderKey(bad name): %v", err)
	}
	if _, err := lambda.ClaimKey(""); !errors.Is(err, ratekit.ErrInvalidConfig) {
		t.Errorf("ClaimKey(\"\"): %v", err)
	}
}

// REST: allowed, state back by header (in lower case) and by cookie, then
// denied, with the handler's own header fields and cookie kept.
func TestREST(t *testing.T) {
	c := newClock()
	a := adapter(t, lambda.Config{
		Guard: guard(t, httplimit.GuardConfig{Limiter: window(t, 2, c), OnError: httplimit.FailClosed}),
		Key:   lambda.SourceIPKey(),
	})
	var calls atomic.Int32
	h := a.REST(func(ctx context.Context, ev events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
		calls.Add(1)
		d, ok := httplimit.DecisionFromContext(ctx)
		req, rok := httplimit.RequestFromContext(ctx)
		want, _ := httplimit.ParseIPKey(clientIP)
		if !ok || !rok || req.Key != want || req.Cost != 1 {
			t.Errorf("handler context: decision %v %+v, request %v %+v", ok, d, rok, req)
		}
		return events.APIGatewayProxyResponse{
			StatusCode: 200,
			Headers:    map[string]string{"content-type": "application/json", "set-cookie": "seen=1; Path=/"},
			Body:       `{"ok":true}`,
		}, nil
	})
	ctx := context.Background()

	resp := invoke[events.APIGatewayProxyResponse](t, ctx, h, fixture(t, "rest.json", nil))
	if resp.StatusCode != 200 || resp.Body != `{"ok":true}` {
		t.Fatalf("first: %d %s", resp.StatusCode, resp.Body)
	}
	if got := single(resp.Headers, "RateLimit-Policy"); got != policy2 {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if got := single(resp.Headers, "RateLimit"); got != `"api";r=1;t=60` {
		t.Errorf("RateLimit %q", got)
	}
	if got := single(resp.Headers, "Content-Type"); got != "application/json" {
		t.Errorf("handler's Content-Type replaced: %q", got)
	}
	token := single(resp.Headers, httplimit.DefaultStateHeader)
	cookies := multi(resp.MultiValueHeaders, "Set-Cookie")
	if token == "" || stateCookie(t, cookies) != token || len(cookies) != 2 || cookies[0] != "seen=1; Path=/" {
		t.Fatalf("state: header %q, Set-Cookie %q", token, cookies)
	}
	if single(resp.Headers, "Set-Cookie") != "" {
		t.Errorf("Set-Cookie left in Headers: %v", resp.Headers)
	}

	// The token comes back in a lower-case header field.
	withHeader := fixture(t, "rest.json", func(m map[string]any) {
		obj(m, "headers")["ratekit-token"] = token
		obj(m, "multiValueHeaders")["ratekit-token"] = []string{token}
	})
	resp = invoke[events.APIGatewayProxyResponse](t, ctx, h, withHeader)
	if resp.StatusCode != 200 || single(resp.Headers, "RateLimit") != `"api";r=0;t=60` {
		t.Fatalf("second: %d %v", resp.StatusCode, resp.Headers)
	}

	// The same token by cookie: the count is already 2, so this is denied.
	withCookie := fixture(t, "rest.json", func(m map[string]any) {
		line := "theme=dark; " + httplimit.DefaultStateCookie + "=" + single(resp.Headers, httplimit.DefaultStateHeader)
		obj(m, "headers")["Cookie"] = line
		obj(m, "multiValueHeaders")["Cookie"] = []string{line}
	})
	c.Add(15 * time.Second)
	resp = invoke[events.APIGatewayProxyResponse](t, ctx, h, withCookie)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("third: %d %s", resp.StatusCode, resp.Body)
	}
	if calls.Load() != 2 {
		t.Errorf("handler ran %d times, want 2", calls.Load())
	}
	checkDenied(t, resp.Headers, resp.Body, policy2, "45")
}

// checkDenied checks the 429 answer that the root middleware gives.
func checkDenied(t *testing.T, h map[string]string, body, policy, retryAfter string) {
	t.Helper()
	if got := single(h, "Retry-After"); got != retryAfter {
		t.Errorf("Retry-After %q, want %q", got, retryAfter)
	}
	if got := single(h, "RateLimit"); got != `"api";r=0;t=`+retryAfter {
		t.Errorf("RateLimit %q", got)
	}
	if got := single(h, "RateLimit-Policy"); got != policy {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if got := single(h, "Content-Type"); got != problemCT {
		t.Errorf("Content-Type %q", got)
	}
	p := problemOf(t, body)
	if p.Type != httplimit.ProblemTypeQuotaExceeded || p.Status != 429 || len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != "api" {
		t.Errorf("problem %+v", p)
	}
}

// HTTP API: cookies travel in their own lists, header names are lower case.
func TestHTTPAPI(t *testing.T) {
	c := newClock()
	a := adapter(t, lambda.Config{
		Guard: guard(t, httplimit.GuardConfig{Limiter: window(t, 2, c), OnError: httplimit.FailClosed}),
		Key:   lambda.SourceIPKey(),
	})
	h := a.HTTPAPI(func(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		return events.APIGatewayV2HTTPResponse{StatusCode: 201, Cookies: []string{"seen=1"}, Body: "made"}, nil
	})
	ctx := context.Background()

	resp := invoke[events.APIGatewayV2HTTPResponse](t, ctx, h, fixture(t, "httpapi.json", nil))
	token := stateCookie(t, resp.Cookies)
	if resp.StatusCode != 201 || token == "" || resp.Cookies[0] != "seen=1" || single(resp.Headers, "RateLimit") != `"api";r=1;t=60` {
		t.Fatalf("first: %d %v %q", resp.StatusCode, resp.Headers, resp.Cookies)
	}
	if single(resp.Headers, "Set-Cookie") != "" {
		t.Errorf("Set-Cookie in Headers: %v", resp.Headers)
	}

	// Back in the event's cookie list, among other cookies.
	back := fixture(t, "httpapi.json", func(m map[string]any) {
		m["cookies"] = []string{"theme=dark", httplimit.DefaultStateCookie + "=" + token, "session=5f2b8c1e"}
	})
	resp = invoke[events.APIGatewayV2HTTPResponse](t, ctx, h, back)
	if resp.StatusCode != 201 || single(resp.Headers, "RateLimit") != `"api";r=0;t=60` {
		t.Fatalf("second: %d %v", resp.StatusCode, resp.Headers)
	}
	back = fixture(t, "httpapi.json", func(m map[string]any) {
		m["cookies"] = []string{httplimit.DefaultStateCookie + "=" + stateCookie(t, resp.Cookies)}
	})
	resp = invoke[events.APIGatewayV2HTTPResponse](t, ctx, h, back)
	if resp.StatusCode != 429 {
		t.Fatalf("third: %d %s", resp.StatusCode, resp.Body)
	}
	checkDenied(t, resp.Headers, resp.Body, policy2, "60")
	if stateCookie(t, resp.Cookies) == "" {
		t.Errorf("denial without the state cookie: %q", resp.Cookies)
	}
}

// Function URL: an IPv6 client is keyed by its /64, as the root middleware
// keys it, and the state comes back by header.
func TestFunctionURL(t *testing.T) {
	rec := &recorder{}
	a := adapter(t, lambda.Config{
		Guard: guard(t, httplimit.GuardConfig{Limiter: rec, OnError: httplimit.FailClosed, NoStateCookie: true}),
		Key:   lambda.SourceIPKey(),
	})
	h := a.FunctionURL(func(ctx context.Context, ev events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
		return events.LambdaFunctionURLResponse{StatusCode: 200, Body: "ok"}, nil
	})
	resp := invoke[events.LambdaFunctionURLResponse](t, context.Background(), h, fixture(t, "functionurl.json", func(m map[string]any) {
		obj(m, "headers")["ratekit-token"] = "client-state"
	}))
	if resp.StatusCode != 200 || single(resp.Headers, "RateLimit") != `"rec";r=999;t=3600` || len(resp.Cookies) != 0 {
		t.Fatalf("%d %v %q", resp.StatusCode, resp.Headers, resp.Cookies)
	}
	got := rec.last(t)
	key, err := httplimit.RemoteAddrKey()(&http.Request{RemoteAddr: "[2001:db8:1:2:a:b:c:d]:443"})
	if err != nil || got.Key != key || got.Key != "ip:2001:db8:1:2::/64" {
		t.Errorf("key %q, root middleware's %q (%v)", got.Key, key, err)
	}
	if got.State != "client-state" {
		t.Errorf("state %q", got.State)
	}
}

// ALB: X-Forwarded-For with a hop count, and the answer in the form the
// request used.
func TestALB(t *testing.T) {
	for _, tc := range []struct {
		fixture string
		multi   bool
	}{{"alb-single.json", false}, {"alb-multi.json", true}} {
		t.Run(tc.fixture, func(t *testing.T) {
			c := newClock()
			key, err := lambda.ForwardedForKey(1)
			if err != nil {
				t.Fatal(err)
			}
			a := adapter(t, lambda.Config{
				Guard: guard(t, httplimit.GuardConfig{Limiter: window(t, 1, c), OnError: httplimit.FailClosed}),
				Key:   key,
			})
			h := a.ALB(func(ctx context.Context, ev events.ALBTargetGroupRequest) (events.ALBTargetGroupResponse, error) {
				resp := events.ALBTargetGroupResponse{StatusCode: 200, StatusDescription: "200 OK", Body: "ok"}
				if tc.multi {
					resp.MultiValueHeaders = map[string][]string{"Set-Cookie": {"seen=1"}}
				} else {
					resp.Headers = map[string]string{"set-cookie": "seen=1"}
				}
				return resp, nil
			})
			resp := invoke[events.ALBTargetGroupResponse](t, context.Background(), h, fixture(t, tc.fixture, nil))
			if resp.StatusCode != 200 {
				t.Fatalf("first: %d %s", resp.StatusCode, resp.Body)
			}
			var token string
			if tc.multi {
				if resp.Headers != nil {
					t.Errorf("single-value headers in a multi-value answer: %v", resp.Headers)
				}
				cookies := multi(resp.MultiValueHeaders, "Set-Cookie")
				token = stateCookie(t, cookies)
				if len(cookies) != 2 || cookies[0] != "seen=1" || token == "" {
					t.Errorf("Set-Cookie %q", cookies)
				}
				if got := multi(resp.MultiValueHeaders, "RateLimit"); len(got) != 1 || got[0] != `"api";r=0;t=60` {
					t.Errorf("RateLimit %q", got)
				}
				token = multi(resp.MultiValueHeaders, httplimit.DefaultStateHeader)[0]
			} else {
				if resp.MultiValueHeaders != nil {
					t.Errorf("multi-value headers in a single-value answer: %v", resp.MultiValueHeaders)
				}
				// One Set-Cookie fits: the handler's; the state travels
				// in the header field.
				if got := single(resp.Headers, "Set-Cookie"); got != "seen=1" {
					t.Errorf("Set-Cookie %q", got)
				}
				if got := single(resp.Headers, "RateLimit"); got != `"api";r=0;t=60` {
					t.Errorf("RateLimit %q", got)
				}
				token = single(resp.Headers, httplimit.DefaultStateHeader)
			}
			if token == "" {
				t.Fatal("no state header")
			}

			again := fixture(t, tc.fixture, func(m map[string]any) {
				if tc.multi {
					obj(m, "multiValueHeaders")["ratekit-token"] = []string{token}
				} else {
					obj(m, "headers")["ratekit-token"] = token
				}
			})
			resp = invoke[events.ALBTargetGroupResponse](t, context.Background(), h, again)
			if resp.StatusCode != 429 || resp.StatusDescription != "429 Too Many Requests" {
				t.Fatalf("second: %d %q", resp.StatusCode, resp.StatusDescription)
			}
			hdr := resp.Headers
			if tc.multi {
				if resp.Headers != nil {
					t.Errorf("single-value headers in a multi-value denial: %v", resp.Headers)
				}
				hdr = map[string]string{}
				for k, v := range resp.MultiValueHeaders {
					if len(v) != 1 && k != "Set-Cookie" {
						t.Errorf("%s: %q", k, v)
					}
					hdr[k] = v[0]
				}
			} else if resp.MultiValueHeaders != nil {
				t.Errorf("multi-value headers in a single-value denial: %v", resp.MultiValueHeaders)
			}
			checkDenied(t, hdr, resp.Body, `"api";q=1;w=60`, "60")
		})
	}
}

// Keys agree with the root package's for the same client, on every event
// that carries the input.
func TestKeyFunctions(t *testing.T) {
	ipKey, _ := httplimit.ParseIPKey(clientIP)
	hashed, _ := httplimit.APIKey(apiKey)
	xff1, _ := lambda.ForwardedForKey(1)
	xff2, _ := lambda.ForwardedForKey(2)
	header, _ := lambda.APIKeyHeaderKey("X-API-Key")
	sub, _ := lambda.ClaimKey("sub")
	principal, _ := lambda.ClaimKey("principalId")
	trial, _ := lambda.ClaimKey("trial")
	n, _ := lambda.ClaimKey("n")
	nested, _ := lambda.ClaimKey("lambda")
	rootXFF, _ := httplimit.ForwardedForKey(1)
	tenant := lambda.EventKey(func(_ context.Context, ev *events.APIGatewayV2HTTPRequest) (string, error) {
		return "tenant:" + ev.QueryStringParameters["currency"], nil
	})
	lambdaAuth := func(m map[string]any) {
		obj(m, "requestContext")["authorizer"] = map[string]any{"principalId": "user-42", "plan": "pro", "trial": false, "claims": "not a map"}
	}
	lambdaAuthV2 := func(m map[string]any) {
		obj(m, "requestContext")["authorizer"] = map[string]any{"lambda": map[string]any{"sub": "user-43", "n": 7}}
	}
	// view keys by what every event type must fill in, through HTTPKey.
	view := lambda.HTTPKey(func(r *http.Request) (string, error) {
		return r.Method + " " + r.URL.Path + " from " + r.RemoteAddr + " via " + r.Header.Get("X-Forwarded-Proto"), nil
	})
	noKey := func(m map[string]any) {
		delete(obj(m, "headers"), "x-api-key")
		delete(obj(m, "multiValueHeaders"), "x-api-key")
	}

	tests := []struct {
		name    string
		fixture string
		patch   func(map[string]any)
		key     lambda.KeyFunc
		want    string // "" means a 400 answer
	}{
		{"rest source ip", "rest.json", nil, lambda.SourceIPKey(), ipKey},
		{"http api source ip", "httpapi.json", nil, lambda.SourceIPKey(), ipKey},
		{"alb has no source ip", "alb-single.json", nil, lambda.SourceIPKey(), ""},
		{"root RemoteAddrKey on rest", "rest.json", nil, lambda.HTTPKey(httplimit.RemoteAddrKey()), ipKey},
		{"rest xff behind cloudfront", "rest.json", nil, xff1, "ip:130.176.137.135"},
		{"rest xff two hops", "rest.json", nil, xff2, ipKey},
		{"alb xff", "alb-single.json", nil, xff1, ipKey},
		{"alb multi xff", "alb-multi.json", nil, xff2, "ip:203.0.113.9"},
		{"root ForwardedForKey on alb", "alb-multi.json", nil, lambda.HTTPKey(rootXFF), ipKey},
		{"alb xff too short", "alb-single.json", func(m map[string]any) { obj(m, "headers")["x-forwarded-for"] = "198.51.100.7" }, xff2, ""},
		{"rest api key header", "rest.json", nil, header, hashed},
		{"http api key header", "httpapi.json", nil, header, hashed},
		{"missing api key header", "httpapi.json", noKey, header, ""},
		{"rest gateway api key", "rest.json", nil, lambda.GatewayAPIKey(), hashed},
		{"gateway api key on http api", "httpapi.json", nil, lambda.GatewayAPIKey(), ""},
		{"rest cognito sub", "rest.json", nil, sub, "claim:sub=" + subject},
		{"http api jwt sub", "httpapi.json", nil, sub, "claim:sub=" + subject},
		{"rest lambda authorizer", "rest.json", lambdaAuth, principal, "claim:principalId=user-42"},
		{"http api lambda authorizer", "httpapi.json", lambdaAuthV2, sub, "claim:sub=user-43"},
		{"rest boolean claim", "rest.json", lambdaAuth, trial, "claim:trial=false"},
		{"http api number claim", "httpapi.json", lambdaAuthV2, n, "claim:n=7"},
		{"http api object claim", "httpapi.json", lambdaAuthV2, nested, ""},
		{"http api without authorizer", "httpapi.json", func(m map[string]any) { delete(obj(m, "requestContext"), "authorizer") }, sub, ""},
		{"function url has no claims", "functionurl.json", nil, sub, ""},
		{"event key", "httpapi.json", nil, tenant, "tenant:EUR"},
		{"request view rest", "rest.json", nil, view, "POST /v1/quotes from " + clientIP + " via https"},
		{"request view http api", "httpapi.json", nil, view, "POST /v1/quotes from " + clientIP + " via https"},
		{"request view function url", "functionurl.json", nil, view, "POST /contact from 2001:db8:1:2:a:b:c:d via https"},
		{"request view alb", "alb-multi.json", nil, view, "GET /v1/quotes from  via https"},
		{"event key on another event", "rest.json", nil, tenant, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			a := adapter(t, lambda.Config{
				Guard: guard(t, httplimit.GuardConfig{Limiter: rec, OnError: httplimit.FailClosed}),
				Key:   tc.key,
			})
			payload := fixture(t, tc.fixture, tc.patch)
			var status int
			var body string
			switch {
			case strings.HasPrefix(tc.fixture, "rest"):
				r := invoke[events.APIGatewayProxyResponse](t, context.Background(), a.REST(okREST), payload)
				status, body = r.StatusCode, r.Body
			case strings.HasPrefix(tc.fixture, "httpapi"):
				r := invoke[events.APIGatewayV2HTTPResponse](t, context.Background(), a.HTTPAPI(okHTTPAPI), payload)
				status, body = r.StatusCode, r.Body
			case strings.HasPrefix(tc.fixture, "functionurl"):
				r := invoke[events.LambdaFunctionURLResponse](t, context.Background(), a.FunctionURL(okURL), payload)
				status, body = r.StatusCode, r.Body
			default:
				r := invoke[events.ALBTargetGroupResponse](t, context.Background(), a.ALB(okALB), payload)
				status, body = r.StatusCode, r.Body
			}
			if tc.want == "" {
				if p := problemOf(t, body); status != 400 || p.Status != 400 || !strings.Contains(p.Detail, "who sends it") {
					t.Fatalf("got %d %s, want 400 for a missing key", status, body)
				}
				if len(rec.reqs) != 0 {
					t.Errorf("limiter called with %+v", rec.reqs)
				}
				return
			}
			if status != 200 {
				t.Fatalf("status %d %s", status, body)
			}
			if got := rec.last(t).Key; got != tc.want {
				t.Errorf("key %q, want %q", got, tc.want)
			}
		})
	}
}

func okREST(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
	return events.APIGatewayProxyResponse{StatusCode: 200}, nil
}

func okHTTPAPI(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
	return events.APIGatewayV2HTTPResponse{StatusCode: 200}, nil
}

func okURL(context.Context, events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
	return events.LambdaFunctionURLResponse{StatusCode: 200}, nil
}

func okALB(context.Context, events.ALBTargetGroupRequest) (events.ALBTargetGroupResponse, error) {
	return events.ALBTargetGroupResponse{StatusCode: 200}, nil
}

// Invalid requests get 400 whatever the failure policy, and never reach the
// handler.
func TestBadRequests(t *testing.T) {
	long := strings.Repeat("k", ratekit.MaxKeyLen+1)
	tests := []struct {
		name   string
		cfg    lambda.Config
		want   error
		detail string // what the client reads
	}{
		{"key too long", lambda.Config{Key: func(context.Context, *lambda.Request) (string, error) { return long, nil }}, ratekit.ErrKeyTooLong, "too long"},
		{"cost zero", lambda.Config{Key: lambda.SourceIPKey(), Cost: func(*lambda.Request) int64 { return 0 }}, ratekit.ErrInvalidCost, "not a positive number"},
		{"cost over the quota", lambda.Config{Key: lambda.SourceIPKey(), Cost: func(*lambda.Request) int64 { return 3 }}, ratekit.ErrCostExceedsQuota, "whole quota"},
		{"idempotency key too long", lambda.Config{Key: lambda.SourceIPKey(), IdempotencyKey: func(*lambda.Request) string { return long }}, ratekit.ErrKeyTooLong, "too long"},
	}
	for _, tc := range tests {
		for _, policy := range []httplimit.FailurePolicy{httplimit.FailOpen, httplimit.FailClosed} {
			t.Run(tc.name+"/"+policy.String(), func(t *testing.T) {
				tc.cfg.Guard = guard(t, httplimit.GuardConfig{Limiter: window(t, 2, newClock()), OnError: policy})
				h := adapter(t, tc.cfg).HTTPAPI(func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
					t.Error("handler ran")
					return events.APIGatewayV2HTTPResponse{}, nil
				})
				resp := invoke[events.APIGatewayV2HTTPResponse](t, context.Background(), h, fixture(t, "httpapi.json", nil))
				p := problemOf(t, resp.Body)
				if resp.StatusCode != 400 || p.Status != 400 || single(resp.Headers, "Content-Type") != problemCT {
					t.Fatalf("%d %v %s", resp.StatusCode, resp.Headers, resp.Body)
				}
				if !strings.Contains(p.Detail, tc.detail) {
					t.Errorf("detail %q does not say %q (%v)", p.Detail, tc.detail, tc.want)
				}
			})
		}
	}
}

// A store failure follows the Guard's failure policy, on every event type.
func TestFailurePolicies(t *testing.T) {
	fallback := window(t, 2, newClock())
	tests := []struct {
		policy   httplimit.FailurePolicy
		fallback ratekit.Limiter
		status   int
	}{
		{httplimit.FailOpen, nil, 200},
		{httplimit.FailClosed, nil, 503},
		{httplimit.UseFallback, fallback, 200},
	}
	for _, tc := range tests {
		t.Run(tc.policy.String(), func(t *testing.T) {
			a := adapter(t, lambda.Config{
				Guard: guard(t, httplimit.GuardConfig{Limiter: failing{}, OnError: tc.policy, Fallback: tc.fallback}),
				Key:   lambda.SourceIPKey(),
			})
			var decided []bool
			h := a.REST(func(ctx context.Context, _ events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
				_, ok := httplimit.DecisionFromContext(ctx)
				decided = append(decided, ok)
				return events.APIGatewayProxyResponse{StatusCode: 200}, nil
			})
			resp := invoke[events.APIGatewayProxyResponse](t, context.Background(), h, fixture(t, "rest.json", nil))
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d %s, want %d", resp.StatusCode, resp.Body, tc.status)
			}
			rl := single(resp.Headers, "RateLimit")
			switch tc.policy {
			case httplimit.FailOpen:
				if rl != "" || len(decided) != 1 || decided[0] {
					t.Errorf("FailOpen: RateLimit %q, decided %v", rl, decided)
				}
			case httplimit.FailClosed:
				p := problemOf(t, resp.Body)
				if p.Type != httplimit.ProblemTypeTemporaryReducedCapacity || p.Status != 503 || len(decided) != 0 {
					t.Errorf("FailClosed: %+v, handler ran %d times", p, len(decided))
				}
			case httplimit.UseFallback:
				if rl != `"api";r=1;t=60` || len(decided) != 1 || !decided[0] {
					t.Errorf("UseFallback: RateLimit %q, decided %v", rl, decided)
				}
			}
		})
	}
}

// The limiter runs under the invocation's context, so the Lambda deadline
// (minus the Guard's DeadlineMargin) bounds it; the handler sees the charged request with its idempotency key.
func TestInvocationContext(t *testing.T) {
	rec := &recorder{}
	a := adapter(t, lambda.Config{
		Guard:          guard(t, httplimit.GuardConfig{Limiter: rec, OnError: httplimit.FailClosed}),
		Key:            lambda.SourceIPKey(),
		Cost:           func(r *lambda.Request) int64 { return int64(len(r.Method)) },
		IdempotencyKey: lambda.HeaderValue("Idempotency-Key"),
	})
	var seen ratekit.Request
	h := a.HTTPAPI(func(ctx context.Context, _ events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		seen, _ = httplimit.RequestFromContext(ctx)
		return events.APIGatewayV2HTTPResponse{StatusCode: 200}, nil
	})
	deadline := time.Now().Add(3 * time.Second).Truncate(time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	payload := fixture(t, "httpapi.json", func(m map[string]any) { obj(m, "headers")["idempotency-key"] = " req-8f14e45f " })
	invoke[events.APIGatewayV2HTTPResponse](t, ctx, h, payload)
	if want := deadline.Add(-httplimit.DefaultDeadlineMargin); !rec.deadline.Equal(want) {
		t.Errorf("limiter saw deadline %v, want the invocation's %v minus DefaultDeadlineMargin", rec.deadline, deadline)
	}
	got := rec.last(t)
	if got.Cost != 4 || got.IdempotencyKey != "req-8f14e45f" || !reflect.DeepEqual(seen, got) {
		t.Errorf("limiter got %+v, handler saw %+v", got, seen)
	}

	// A handler error passes through unchanged.
	boom := errors.New("downstream failed")
	fail := a.HTTPAPI(func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		return events.APIGatewayV2HTTPResponse{}, boom
	})
	if _, err := awslambda.NewHandler(fail).Invoke(ctx, payload); err == nil || !strings.Contains(err.Error(), boom.Error()) {
		t.Errorf("handler error: %v", err)
	}
}

// Cold-start hygiene: one Adapter built at init serves concurrent
// invocations exactly (Lambda managed instances run several at once),
// starts no goroutine, and an instance thawed after a long freeze decides
// correctly without anything having run in between.
func TestColdStartHygiene(t *testing.T) {
	defer leakcheck.VerifyNone(t)

	// Built once, as main would before lambda.Start.
	q := &counter{limit: 100, used: map[string]int64{}}
	a := adapter(t, lambda.Config{
		Guard: guard(t, httplimit.GuardConfig{Limiter: q, OnError: httplimit.FailClosed}),
		Key:   lambda.SourceIPKey(),
	})
	wrapped := a.HTTPAPI(okHTTPAPI)
	payload := fixture(t, "httpapi.json", nil)
	var ok, denied atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// One aws-lambda-go Handler per goroutine: its Invoke returns
			// bytes of a pooled buffer that it has already released, so
			// one Handler cannot be invoked concurrently. The wrapped
			// function, what this package provides, is shared.
			h := awslambda.NewHandler(wrapped)
			for i := 0; i < 10; i++ {
				out, err := h.Invoke(context.Background(), payload)
				switch {
				case err != nil:
					t.Error(err)
				case strings.Contains(string(out), `"statusCode":200`):
					ok.Add(1)
				case strings.Contains(string(out), `"statusCode":429`):
					denied.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 100 || denied.Load() != 60 {
		t.Errorf("allowed %d, denied %d; want exactly 100 and 60", ok.Load(), denied.Load())
	}

	// Freeze: the instance is suspended for an hour with a token in a
	// past window. On thaw the first decision starts a fresh window.
	c := newClock()
	sw := window(t, 2, c)
	thawed := adapter(t, lambda.Config{
		Guard: guard(t, httplimit.GuardConfig{Limiter: sw, OnError: httplimit.FailClosed}),
		Key:   lambda.SourceIPKey(),
	}).HTTPAPI(func(ctx context.Context, _ events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		d, _ := httplimit.DecisionFromContext(ctx)
		if d.StateError != nil && !errors.Is(d.StateError, signedwindow.ErrTokenStaleWindow) && !errors.Is(d.StateError, signedwindow.ErrTokenMissing) {
			t.Errorf("state error %v", d.StateError)
		}
		return events.APIGatewayV2HTTPResponse{StatusCode: 200}, nil
	})
	token := ""
	for i := 0; i < 2; i++ {
		resp := invoke[events.APIGatewayV2HTTPResponse](t, context.Background(), thawed, fixture(t, "httpapi.json", func(m map[string]any) {
			obj(m, "headers")["ratekit-token"] = token
		}))
		token = single(resp.Headers, httplimit.DefaultStateHeader)
	}
	c.Add(time.Hour)
	resp := invoke[events.APIGatewayV2HTTPResponse](t, context.Background(), thawed, fixture(t, "httpapi.json", func(m map[string]any) {
		obj(m, "headers")["ratekit-token"] = token
	}))
	if resp.StatusCode != 200 || single(resp.Headers, "RateLimit") != `"api";r=1;t=60` {
		t.Errorf("after thaw: %d %v", resp.StatusCode, resp.Headers)
	}
}

// The handler's own header fields win over the adapter's, in whichever map
// it put them; header names that differ only in case are one field.
func TestHandlerFieldsWin(t *testing.T) {
	rec := &recorder{}
	key, _ := lambda.APIKeyHeaderKey("X-Api-Key")
	a := adapter(t, lambda.Config{
		Guard: guard(t, httplimit.GuardConfig{Limiter: rec, OnError: httplimit.FailClosed}),
		Key:   key,
	})
	h := a.REST(func(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
		return events.APIGatewayProxyResponse{
			StatusCode:        200,
			MultiValueHeaders: map[string][]string{"ratelimit": {"mine"}, "Set-Cookie": {"a=1"}},
		}, nil
	})
	payload := fixture(t, "rest.json", func(m map[string]any) {
		delete(m, "multiValueHeaders")
		// Two copies of one field that agree are one field (conflicting
		// ones are refused: TestConflictingHeaderCopies).
		obj(m, "headers")["X-API-KEY"] = "first"
		obj(m, "headers")["x-api-key"] = "first"
		obj(m, "headers")["ratekit-token"] = "tok"
	})
	resp := invoke[events.APIGatewayProxyResponse](t, context.Background(), h, payload)
	if resp.Headers != nil {
		t.Errorf("Headers %v: the handler used MultiValueHeaders only", resp.Headers)
	}
	if got := multi(resp.MultiValueHeaders, "RateLimit"); len(got) != 1 || got[0] != "mine" {
		t.Errorf("RateLimit %q, want the handler's", got)
	}
	if got := multi(resp.MultiValueHeaders, "RateLimit-Policy"); len(got) != 1 || got[0] != `"rec";q=1000;w=3600` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	got := rec.last(t)
	first, _ := httplimit.APIKey("first")
	if got.Key != first || got.State != "tok" {
		t.Errorf("request %+v", got)
	}
}

func TestNilHandlerPanicsAtWrapTime(t *testing.T) {
	a := adapter(t, lambda.Config{
		Guard: guard(t, httplimit.GuardConfig{Limiter: &recorder{}, OnError: httplimit.FailClosed}),
		Key:   lambda.SourceIPKey(),
	})
	for name, wrap := range map[string]func(){
		"REST":        func() { a.REST(nil) },
		"HTTPAPI":     func() { a.HTTPAPI(nil) },
		"FunctionURL": func() { a.FunctionURL(nil) },
		"ALB":         func() { a.ALB(nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s(nil) did not panic", name)
				}
			}()
			wrap()
		}()
	}
}

// Config.Denied replaces the body of a 429 and keeps the RateLimit fields, as
// MiddlewareConfig.Denied does; other refusals keep the Guard's answer.
func TestDenied(t *testing.T) {
	c := newClock()
	var seen ratekit.Decision
	a := adapter(t, lambda.Config{
		Guard: guard(t, httplimit.GuardConfig{Limiter: window(t, 1, c), OnError: httplimit.FailClosed}),
		Key:   lambda.SourceIPKey(),
		Denied: func(ctx context.Context, r *lambda.Request, d ratekit.Decision, h http.Header) (int, string) {
			seen = d
			if h.Get("Content-Type") != "" || h.Get("Retry-After") != "60" {
				t.Errorf("header given to Denied: %v", h)
			}
			h.Set("Content-Type", "text/html; charset=utf-8")
			return http.StatusTooManyRequests, "<p>Slow down, " + r.SourceIP + ".</p>"
		},
	})
	h := a.FunctionURL(func(context.Context, events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
		return events.LambdaFunctionURLResponse{StatusCode: 200}, nil
	})
	resp := invoke[events.LambdaFunctionURLResponse](t, context.Background(), h, fixture(t, "functionurl.json", nil))
	token := single(resp.Headers, httplimit.DefaultStateHeader)
	resp = invoke[events.LambdaFunctionURLResponse](t, context.Background(), h, fixture(t, "functionurl.json", func(m map[string]any) {
		obj(m, "headers")["ratekit-token"] = token
	}))
	if resp.StatusCode != 429 || resp.Body != "<p>Slow down, 2001:db8:1:2:a:b:c:d.</p>" ||
		single(resp.Headers, "Content-Type") != "text/html; charset=utf-8" || single(resp.Headers, "RateLimit") != `"api";r=0;t=60` ||
		stateCookie(t, resp.Cookies) == "" || seen.Allowed || seen.Quota != 1 {
		t.Fatalf("%d %v %q %s; decision %+v", resp.StatusCode, resp.Headers, resp.Cookies, resp.Body, seen)
	}

	// A bad key is still the Guard's 400.
	resp = invoke[events.LambdaFunctionURLResponse](t, context.Background(), h, fixture(t, "functionurl.json", func(m map[string]any) {
		obj(m, "requestContext", "http")["sourceIp"] = "not an address"
	}))
	if resp.StatusCode != 400 || single(resp.Headers, "Content-Type") != problemCT {
		t.Fatalf("bad key: %d %v %s", resp.StatusCode, resp.Headers, resp.Body)
	}
}
