package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	awslambda "github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
)

// TestPaidAPI runs the function's handler through aws-lambda-go's real JSON
// path against the test DynamoDB (dynalite in CI): a known key gets its 100
// calls (and what refills meanwhile), then 429 with Retry-After; an unknown
// key gets 401, as examples/paidapi answers it.
func TestPaidAPI(t *testing.T) {
	endpoint := testenv.DynamoDBEndpoint(t)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true // dynalite closes idle connections under requests (see dynamostore's tests)
	t.Cleanup(tr.CloseIdleConnections)
	client := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		HTTPClient:   &http.Client{Transport: tr},
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test"}, nil
		}),
	})
	table := "ratekit_example_paidapi"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := dynamostore.CreateTable(ctx, client, table); err != nil && !(isNoTTL(err) && os.Getenv(testenv.DynamoDBEnv) == "") {
		t.Fatal(err)
	}
	key := "key-" + time.Now().Format("150405.000000000")
	env := map[string]string{"RATEKIT_TABLE": table, "PAIDAPI_KEYS": "other," + key}
	// A patient timeout: dynalite on a loaded machine is no DynamoDB.
	h, err := newHandler(client, func(k string) string { return env[k] }, 30*time.Second, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	invoke := awslambda.NewHandler(h)
	call := func(apiKey string) events.APIGatewayV2HTTPResponse {
		t.Helper()
		ev := events.APIGatewayV2HTTPRequest{
			RawPath:               "/v1/quote",
			Headers:               map[string]string{"x-api-key": apiKey},
			QueryStringParameters: map[string]string{"symbol": "ACME"},
			RequestContext: events.APIGatewayV2HTTPRequestContext{
				HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: http.MethodGet, Path: "/v1/quote", SourceIP: "192.0.2.1"},
			},
		}
		payload, _ := json.Marshal(ev)
		out, err := invoke.Invoke(ctx, payload)
		if err != nil {
			t.Fatal(err)
		}
		var resp events.APIGatewayV2HTTPResponse
		if err := json.Unmarshal(out, &resp); err != nil {
			t.Fatal(err)
		}
		return resp
	}
	start := time.Now()
	admitted := 0
	var resp events.APIGatewayV2HTTPResponse
	for admitted < 200 {
		if resp = call(key); resp.StatusCode != 200 {
			break
		}
		admitted++
	}
	// 100, plus what refilled meanwhile (100 a minute).
	most := 100 + int(time.Since(start).Minutes()*100) + 1
	if resp.StatusCode != 429 || resp.Headers["Retry-After"] == "" || admitted < 100 || admitted > most {
		t.Fatalf("after %d calls admitted: %d %v %s; want 429 with Retry-After after 100 to %d", admitted, resp.StatusCode, resp.Headers, resp.Body, most)
	}
	for _, k := range []string{"unknown", ""} {
		if resp := call(k); resp.StatusCode != 401 || resp.Headers["Content-Type"] != httplimit.ProblemContentType {
			t.Fatalf("unknown key %q: %d %v %s; want 401", k, resp.StatusCode, resp.Headers, resp.Body)
		}
	}
}

func isNoTTL(err error) bool { return errors.Is(err, dynamostore.ErrNoTTL) }
