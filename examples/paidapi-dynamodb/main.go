// Command paidapi is a paid API on AWS Lambda with DynamoDB as its only
// store: no database or cache to run, size or keep warm. Each API key (the
// X-Api-Key header of an API Gateway HTTP API request) has a token bucket
// of 100 calls refilled 100 a minute, counted exactly (tokenbucket's Atomic
// mode: one conditional UpdateItem per call). A request without a known key
// gets 400 without touching DynamoDB. When DynamoDB fails (throttled, unreachable, slower
// than 300ms) the call is refused with 503: a paid tier does not give away
// what it cannot count.
//
// It reads:
//
//	RATEKIT_TABLE   the DynamoDB table (required; see template.yaml)
//	PAIDAPI_KEYS    comma-separated API keys of the customers (required)
//
// The client is built from the function's environment (region and the
// execution role's credentials). template.yaml beside this file is the SAM
// template: the table with Time to Live, the function, and an IAM policy of
// the two actions a take needs, dynamodb:UpdateItem and dynamodb:GetItem
// (Reset would need DeleteItem; this API never resets).
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
	awslambda "github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
	"github.com/ratekit/ratekit/lambda"
	"github.com/ratekit/ratekit/tokenbucket"
)

func main() {
	client := dynamodb.New(dynamodb.Options{
		Region:      os.Getenv("AWS_REGION"),
		Credentials: envCredentials{},
	})
	handler, err := newHandler(client, os.Getenv, 300*time.Millisecond)
	if err != nil {
		log.Fatal(err)
	}
	awslambda.Start(handler)
}

// envCredentials reads the credentials Lambda puts in the environment for
// the execution role, so that the function needs no SDK config module.
type envCredentials struct{}

func (envCredentials) Retrieve(context.Context) (aws.Credentials, error) {
	c := aws.Credentials{
		AccessKeyID:     os.Getenv("AWS_ACCESS_KEY_ID"),
		SecretAccessKey: os.Getenv("AWS_SECRET_ACCESS_KEY"),
		SessionToken:    os.Getenv("AWS_SESSION_TOKEN"),
		Source:          "environment",
	}
	if c.AccessKeyID == "" || c.SecretAccessKey == "" {
		return aws.Credentials{}, errors.New("AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY is not set")
	}
	return c, nil
}

// newHandler builds the function's handler on client. A decision that
// takes longer than timeout fails closed (503).
func newHandler(client *dynamodb.Client, getenv func(string) string, timeout time.Duration) (lambda.HTTPAPIHandler, error) {
	store, err := dynamostore.New(client, dynamostore.Config{Table: getenv("RATEKIT_TABLE")})
	if err != nil {
		return nil, fmt.Errorf("RATEKIT_TABLE: %w", err)
	}
	var keys []string
	for _, k := range strings.Split(getenv("PAIDAPI_KEYS"), ",") {
		if k = strings.TrimSpace(k); k != "" {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil, errors.New("PAIDAPI_KEYS is empty")
	}
	limiter, err := tokenbucket.New(tokenbucket.Config{
		Name:       "paid",
		Burst:      100,
		RefillRate: tokenbucket.PerMinute(100),
		Mode:       tokenbucket.Atomic,
		Store:      store,
		// Callers over their limit are answered from memory until their
		// retry time: no DynamoDB request, no cost.
		DeniedCacheSize: 10_000,
	})
	if err != nil {
		return nil, err
	}
	guard, err := httplimit.NewGuard(httplimit.GuardConfig{
		Limiter: limiter,
		OnError: httplimit.FailClosed,
		Timeout: timeout,
	})
	if err != nil {
		return nil, err
	}
	// Only customers' keys are limited (and served); the bucket's key is
	// the API key hashed by httplimit.APIKey, so DynamoDB never holds a key.
	known := func(_ context.Context, r *lambda.Request) (string, error) {
		k := r.Header.Get("X-Api-Key")
		if !slices.Contains(keys, k) {
			return "", fmt.Errorf("%w: unknown API key", httplimit.ErrNoKey)
		}
		return httplimit.APIKey(k)
	}
	adapter, err := lambda.New(lambda.Config{Guard: guard, Key: known})
	if err != nil {
		return nil, err
	}
	return adapter.HTTPAPI(quote), nil
}

// quote is the paid work.
func quote(ctx context.Context, req events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
	d, _ := httplimit.DecisionFromContext(ctx)
	return events.APIGatewayV2HTTPResponse{
		StatusCode: 200,
		Headers:    map[string]string{"Content-Type": "application/json"},
		Body:       fmt.Sprintf(`{"symbol":%q,"price":42,"remaining":%d}`, req.QueryStringParameters["symbol"], d.Remaining),
	}, nil
}
