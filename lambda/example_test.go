package lambda_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/lambda"
	"github.com/ratekit/ratekit/signedwindow"
)

// An HTTP API handler limited to 2 requests a minute per client IP, with no
// storage: the client carries a signed token. In a real function, everything
// up to the wrapped handler runs once in main, which then calls
// lambda.Start(handler) from github.com/aws/aws-lambda-go/lambda.
func Example() {
	limiter, err := signedwindow.New(signedwindow.Config{
		Name:   "api",
		Quota:  2,
		Window: time.Minute,
		Keys:   []signedwindow.Key{{ID: 1, Secret: []byte("an example secret of 32 bytes!!!")}},
	})
	if err != nil {
		panic(err)
	}
	guard, err := httplimit.NewGuard(httplimit.GuardConfig{Limiter: limiter, OnError: httplimit.FailOpen})
	if err != nil {
		panic(err)
	}
	adapter, err := lambda.New(lambda.Config{Guard: guard, Key: lambda.SourceIPKey()})
	if err != nil {
		panic(err)
	}
	handler := adapter.HTTPAPI(func(ctx context.Context, req events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		d, _ := httplimit.DecisionFromContext(ctx)
		return events.APIGatewayV2HTTPResponse{StatusCode: 200, Body: fmt.Sprintf("hello, %d left", d.Remaining)}, nil
	})

	// What API Gateway sends: the client sends its token back as a cookie.
	var cookies []string
	for i := 1; i <= 3; i++ {
		req := events.APIGatewayV2HTTPRequest{Cookies: cookies}
		req.RequestContext.HTTP.SourceIP = "203.0.113.7"
		resp, err := handler(context.Background(), req)
		if err != nil {
			panic(err)
		}
		h := http.Header{}
		for name, value := range resp.Headers {
			h.Set(name, value)
		}
		fmt.Printf("%d RateLimit: %s Retry-After: %q\n", resp.StatusCode, h.Get("RateLimit"), h.Get("Retry-After"))
		for _, line := range resp.Cookies { // what the browser keeps
			if c, err := http.ParseSetCookie(line); err == nil {
				cookies = []string{c.Name + "=" + c.Value}
			}
		}
	}
	// Output:
	// 200 RateLimit: "api";r=1;t=60 Retry-After: ""
	// 200 RateLimit: "api";r=0;t=60 Retry-After: ""
	// 429 RateLimit: "api";r=0;t=60 Retry-After: "60"
}
