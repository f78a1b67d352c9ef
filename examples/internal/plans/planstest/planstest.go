// Package planstest holds the checks that every command selling package
// plans' paid API passes, whatever its store (examples/paidapi on
// PostgreSQL, examples/paidapi-dynamodb on DynamoDB), and the helpers that
// invoke a handler the way aws-lambda-go does.
package planstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	awslambda "github.com/aws/aws-lambda-go/lambda"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/examples/internal/plans"
)

// AdminToken is the admin token of Setup's default, which Request sends
// with a body.
const AdminToken = "admin-token"

// Setup is what a check asks of the command under test.
type Setup struct {
	// Keys is PAIDAPI_KEYS: the customers, with keys of their own.
	Keys  string
	Tiers plans.Tiers
	// AdminToken is empty when the admin route is off.
	AdminToken string
	Quote      func(ctx context.Context, symbol string) (float64, error)
}

// NewHandler returns the command's handler for s, counting under a prefix
// of its own.
type NewHandler func(t *testing.T, s Setup) awslambda.Handler

// Default returns the Setup of most checks for keys: the free plan is 3
// calls a month, pro 5 and enterprise per customer, each with a burst of
// 50 calls a minute (so that a slow machine refills nothing between
// calls), the admin token AdminToken and a quote of 1 (an error for the
// symbol FAIL).
func Default(keys string) Setup {
	return Setup{
		Keys:       keys,
		Tiers:      plans.Tiers{Free: plans.Tier{Burst: 50, Quota: 3}, Pro: plans.Tier{Burst: 50, Quota: 5}, EnterpriseBurst: 50, BurstWindow: time.Minute},
		AdminToken: AdminToken,
		Quote:      quote,
	}
}

// quote is the downstream work of the checks: 1, or an error for FAIL.
func quote(_ context.Context, symbol string) (float64, error) {
	if symbol == "FAIL" {
		return 0, errUpstream
	}
	return 1, nil
}

// Unique returns name with a random suffix: a key or prefix no other test
// run uses.
func Unique(name string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return name + "-" + hex.EncodeToString(b)
}

// Result is a handler's answer.
type Result struct {
	Status int
	Header http.Header
	Body   string
}

// Event returns the API Gateway HTTP API (payload 2.0) event of
// GET /v1/quote?symbol=ACME with no API key.
func Event() events.APIGatewayV2HTTPRequest {
	return events.APIGatewayV2HTTPRequest{
		Version: "2.0", RouteKey: "GET /v1/quote", RawPath: "/v1/quote", RawQueryString: "symbol=ACME",
		Headers: map[string]string{
			"accept": "application/json", "host": "r3pmxmplak.execute-api.eu-west-1.amazonaws.com",
			"user-agent": "curl/8.5.0", "x-forwarded-for": "198.51.100.7", "x-forwarded-proto": "https",
		},
		QueryStringParameters: map[string]string{"symbol": "ACME"},
		RequestContext: events.APIGatewayV2HTTPRequestContext{
			AccountID: "123456789012", APIID: "r3pmxmplak", Stage: "$default", RequestID: "JKJaXmPLvHcESHA=",
			HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{
				Method: http.MethodGet, Path: "/v1/quote", Protocol: "HTTP/1.1", SourceIP: "198.51.100.7", UserAgent: "curl/8.5.0",
			},
		},
	}
}

// invokeMu makes concurrent calls of CallWith invoke one at a time.
var invokeMu sync.Mutex

// CallWith invokes h through aws-lambda-go's JSON path with Event changed
// by patch, within an invocation deadline of 10 s.
func CallWith(t testing.TB, h awslambda.Handler, patch func(*events.APIGatewayV2HTTPRequest)) Result {
	t.Helper()
	ev := Event()
	patch(&ev)
	payload, _ := json.Marshal(ev)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // the invocation's deadline
	defer cancel()
	// aws-lambda-go's handler encodes replies into one buffer, which the
	// reply it returns shares, as the Lambda runtime (an instance invoked
	// once at a time) allows: callers from several goroutines take turns
	// and copy the reply before the next.
	invokeMu.Lock()
	out, err := h.Invoke(ctx, payload)
	out = append([]byte(nil), out...)
	invokeMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	var resp events.APIGatewayV2HTTPResponse
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatal(err)
	}
	hdr := http.Header{}
	for k, v := range resp.Headers {
		hdr.Set(k, v)
	}
	return Result{resp.StatusCode, hdr, resp.Body}
}

// Call invokes h with a metered call of apiKey for symbol, with an
// Idempotency-Key when idem is not empty.
func Call(t testing.TB, h awslambda.Handler, apiKey, symbol, idem string) Result {
	t.Helper()
	return CallWith(t, h, func(ev *events.APIGatewayV2HTTPRequest) {
		ev.Headers["x-api-key"] = apiKey
		if idem != "" {
			ev.Headers["idempotency-key"] = idem
		}
		ev.QueryStringParameters["symbol"] = symbol
	})
}

// Request invokes h with method and path, with apiKey (when not empty)
// and, for a body, the admin token AdminToken.
func Request(t testing.TB, h awslambda.Handler, method, path, apiKey, body string) Result {
	t.Helper()
	return CallWith(t, h, func(ev *events.APIGatewayV2HTTPRequest) {
		ev.RawPath, ev.RequestContext.HTTP.Method, ev.RequestContext.HTTP.Path = path, method, path
		ev.QueryStringParameters, ev.RawQueryString = nil, ""
		if apiKey != "" {
			ev.Headers["x-api-key"] = apiKey
		}
		if body != "" {
			ev.Headers["authorization"] = "Bearer " + AdminToken
			ev.Headers["content-type"] = "application/json"
			ev.Body = body
		}
	})
}

// UsageOf returns the answer of GET /usage for apiKey, failing t unless it
// is a 200 with two policies.
func UsageOf(t testing.TB, h awslambda.Handler, apiKey string) plans.UsageReport {
	t.Helper()
	r := Request(t, h, "GET", "/usage", apiKey, "")
	var u plans.UsageReport
	if err := json.Unmarshal([]byte(r.Body), &u); r.Status != 200 || err != nil || len(u.Policies) != 2 {
		t.Fatalf("GET /usage: %d %s (%v)", r.Status, r.Body, err)
	}
	return u
}

// SetPlan changes apiKey's plan through POST /admin/plan, failing t unless
// it is a 200.
func SetPlan(t testing.TB, h awslambda.Handler, apiKey, plan string, quota int64) {
	t.Helper()
	body, _ := json.Marshal(plans.PlanChange{APIKey: apiKey, Plan: plan, Quota: quota})
	if r := Request(t, h, "POST", "/admin/plan", "", string(body)); r.Status != 200 {
		t.Fatalf("POST /admin/plan %s: %d %s", body, r.Status, r.Body)
	}
}

// Admitted makes n calls for apiKey and returns how many got 200; any
// answer other than 200 and 429 fails t.
func Admitted(t testing.TB, h awslambda.Handler, apiKey string, n int) int {
	t.Helper()
	ok := 0
	for i := 0; i < n; i++ {
		switch r := Call(t, h, apiKey, "ACME", ""); r.Status {
		case 200:
			ok++
		case 429:
		default:
			t.Fatalf("call %d: %d %s", i, r.Status, r.Body)
		}
	}
	return ok
}

// MonthSeconds is the length in seconds of the current billing month of
// anchor (the zero Time: calendar months), the w of the monthly policy.
func MonthSeconds(anchor time.Time) int64 {
	start, end := ratekit.Period{Unit: ratekit.Month, Location: time.UTC, Anchor: anchor}.Bounds(time.Now())
	return int64(end.Sub(start) / time.Second)
}
