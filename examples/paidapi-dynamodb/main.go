// Command paidapi-dynamodb is a paid API on AWS Lambda with DynamoDB as its
// only store: no database or cache to run, size or keep warm. Each API key
// (the X-Api-Key header of an API Gateway HTTP API request) has a token
// bucket of 100 calls refilled 100 a minute, counted exactly (tokenbucket's
// Atomic mode: one conditional UpdateItem per call). A request without a
// known key gets 401 without touching DynamoDB. When DynamoDB fails
// (throttled, unreachable, slower than 300ms) the call is refused with 503
// and Retry-After: a paid tier does not give away what it cannot count. The
// log says why at once (the first failure's error), then at most one line
// per 30 s with the number of failures since, never a line per call.
//
// It reads:
//
//	RATEKIT_TABLE              the DynamoDB table (required; see template.yaml)
//	PAIDAPI_KEYS               comma-separated API keys of the customers (required)
//	RATEKIT_DYNAMODB_ENDPOINT  a DynamoDB endpoint to use instead of AWS's (optional)
//
// The client comes from the AWS SDK's configuration loading
// (config.LoadDefaultConfig): region and credentials from the environment
// (on Lambda, the execution role's), and AWS_ENDPOINT_URL_DYNAMODB or
// AWS_ENDPOINT_URL when set; RATEKIT_DYNAMODB_ENDPOINT overrides them all.
//
// With -local it serves the same handler over plain HTTP, translating each
// request into the HTTP API event API Gateway would send, so that it can be
// tried against DynamoDB Local or dynalite (README.md). Started without
// -local outside Lambda, it says so and exits with status 2.
//
// template.yaml beside this file is the SAM template: the table with Time to
// Live, the function, and an IAM policy of the two actions a take needs,
// dynamodb:UpdateItem and dynamodb:GetItem (Reset would need DeleteItem;
// this API never resets). sam build runs examples/Makefile.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-lambda-go/events"
	awslambda "github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/examples/internal/apigwlocal"
	"github.com/ratekit/ratekit/examples/internal/cli"
	"github.com/ratekit/ratekit/examples/internal/lambdaenv"
	"github.com/ratekit/ratekit/examples/internal/outage"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
	"github.com/ratekit/ratekit/lambda"
	"github.com/ratekit/ratekit/tokenbucket"
)

// EndpointEnv names a DynamoDB endpoint that overrides the SDK's (the
// variable ratekit's tests use to find theirs).
const EndpointEnv = "RATEKIT_DYNAMODB_ENDPOINT"

// apiKeyField is the request header field that carries the API key.
const apiKeyField = "X-Api-Key"

// defaultTimeout bounds a decision: slower, DynamoDB counts as failed.
const defaultTimeout = 300 * time.Millisecond

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stderr, nil)
	stop()
	os.Exit(cli.Exit("paidapi-dynamodb", err, os.Stderr))
}

// run builds the client and the handler once and then serves: on Lambda
// through lambda.Start, with -local over HTTP until ctx ends. When ready is
// not nil it receives the local server's address.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready chan<- string) error {
	fs := flag.NewFlagSet("paidapi-dynamodb", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cli.SetUsage(fs, "paidapi-dynamodb [-local [-addr host:port] [-create-table]] [-timeout duration]",
		`Environment:
  RATEKIT_TABLE              the DynamoDB table (required)
  PAIDAPI_KEYS               comma-separated API keys of the customers (required)
  RATEKIT_DYNAMODB_ENDPOINT  DynamoDB endpoint, overriding AWS_ENDPOINT_URL_DYNAMODB
                             and AWS_ENDPOINT_URL (optional)
  AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...  as the AWS SDK reads them

Without -local it must run in AWS Lambda (provided.al2023).
`)
	local := fs.Bool("local", false, "serve over plain HTTP instead of the Lambda runtime")
	addr := cli.String(fs, "addr", "127.0.0.1:8080", "`host:port` to listen on with -local", func(v string) error {
		if _, _, err := net.SplitHostPort(v); err != nil {
			return errors.New("must be host:port, such as 127.0.0.1:8080")
		}
		return nil
	})
	createTable := fs.Bool("create-table", false, "with -local, create RATEKIT_TABLE first if it does not exist (for DynamoDB Local or dynalite)")
	timeout := cli.Duration(fs, "timeout", defaultTimeout, time.Millisecond, time.Minute,
		"`bound` on each decision; DynamoDB slower than this fails the call with 503")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if !*local {
		if *createTable {
			return &cli.UsageError{Err: errors.New("-create-table works with -local only: on AWS the table comes from template.yaml")}
		}
		// Before anything else: outside Lambda, lambda.Start would fail
		// with a message that does not mention -local.
		if err := lambdaenv.Check(getenv, "run with -local to serve on localhost"); err != nil {
			return err
		}
	}
	logger := slog.New(slog.NewJSONHandler(stderr, nil))
	client, err := newClient(ctx, getenv)
	if err != nil {
		return err
	}
	if *createTable {
		table := getenv("RATEKIT_TABLE")
		if table == "" {
			return errors.New("RATEKIT_TABLE is not set")
		}
		tctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := dynamostore.CreateTable(tctx, client, table)
		cancel()
		switch {
		case errors.Is(err, dynamostore.ErrNoTTL):
			// dynalite has no Time to Live: expired buckets stay, which
			// a local run does not mind (the store checks expiry on read).
			logger.Warn("table ready, but this DynamoDB has no Time to Live", "table", table)
		case err != nil:
			return fmt.Errorf("creating table %s: %w", table, err)
		}
	}
	handler, err := newHandler(client, getenv, *timeout, logger)
	if err != nil {
		return err
	}
	if !*local {
		awslambda.StartWithOptions(handler, awslambda.WithContext(ctx))
		return nil
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	logger.Info("paid API listening", "addr", "http://"+ln.Addr().String(), "table", getenv("RATEKIT_TABLE"))
	if ready != nil {
		ready <- ln.Addr().String()
	}
	return apigwlocal.Serve(ctx, ln, apigwlocal.Handler(handler), logger)
}

// newClient builds the DynamoDB client from the AWS SDK's configuration
// loading, which reads the region, the credentials and the endpoint
// variables (AWS_ENDPOINT_URL_DYNAMODB, AWS_ENDPOINT_URL) from the
// environment and shared files; getenv(EndpointEnv), when set, overrides
// the endpoint.
func newClient(ctx context.Context, getenv func(string) string) (*dynamodb.Client, error) {
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("loading the AWS SDK configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, errors.New("no AWS region: set AWS_REGION (any region, such as us-east-1, for DynamoDB Local or dynalite)")
	}
	var opts []func(*dynamodb.Options)
	if ep := getenv(EndpointEnv); ep != "" {
		opts = append(opts, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(ep) })
	}
	return dynamodb.NewFromConfig(cfg, opts...), nil
}

// newHandler builds the function's handler on client. A decision that
// takes longer than timeout fails closed (503); logger receives the
// outage reports.
func newHandler(client *dynamodb.Client, getenv func(string) string, timeout time.Duration, logger *slog.Logger) (lambda.HTTPAPIHandler, error) {
	store, err := dynamostore.New(client, dynamostore.Config{Table: getenv("RATEKIT_TABLE")})
	if err != nil {
		return nil, fmt.Errorf("RATEKIT_TABLE: %w", err)
	}
	keys := map[string]bool{} // by httplimit.APIKey
	for _, k := range strings.Split(getenv("PAIDAPI_KEYS"), ",") {
		if k = strings.TrimSpace(k); k != "" {
			key, err := httplimit.APIKey(k)
			if err != nil {
				return nil, fmt.Errorf("PAIDAPI_KEYS: %w", err)
			}
			keys[key] = true
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
	// The reporter says why calls get 503: the first failure at once with
	// its cause, then at most a line per outage.DefaultInterval with a
	// count, and a line when DynamoDB answers again.
	observer := outage.New(outage.Config{Logger: logger, Store: "DynamoDB"}).Observer()
	guard, err := httplimit.NewGuard(httplimit.GuardConfig{
		Limiter:  ratekit.Observe(limiter, observer),
		Observer: observer,
		OnError:  httplimit.FailClosed,
		Timeout:  timeout,
		// The Guard would log the same failures (throttled on its own
		// clock): the reporter's lines are the only ones. authenticate
		// answers bad keys before the Guard sees them.
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, err
	}
	// The bucket's key is the API key hashed by httplimit.APIKey, so
	// DynamoDB never holds a key.
	apiKey, err := lambda.APIKeyHeaderKey(apiKeyField)
	if err != nil {
		return nil, err
	}
	adapter, err := lambda.New(lambda.Config{Guard: guard, Key: apiKey})
	if err != nil {
		return nil, err
	}
	return authenticate(keys, adapter.HTTPAPI(quote)), nil
}

// authenticate refuses requests whose X-Api-Key is not a customer's key with
// 401, before the limiter: an unknown key costs no DynamoDB request. It
// reads the field with lambda.EventHeader and keys it with httplimit.APIKey,
// the rule the adapter's key function uses, so the key it authenticates is
// the key that is charged; an event whose copies of the field conflict
// (x-api-key and X-Api-Key with different values) is refused with 400.
func authenticate(keys map[string]bool, next lambda.HTTPAPIHandler) lambda.HTTPAPIHandler {
	return func(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		h, err := lambda.EventHeader(&ev)
		if err != nil {
			return problem(http.StatusBadRequest, "Bad Request", err.Error()), nil
		}
		key, err := httplimit.APIKey(h.Get(apiKeyField))
		if err != nil || !keys[key] {
			return problem(http.StatusUnauthorized, "Unauthorized", "send a valid API key in X-Api-Key"), nil
		}
		return next(ctx, ev)
	}
}

func problem(status int, title, detail string) events.APIGatewayV2HTTPResponse {
	body, _ := json.Marshal(httplimit.Problem{Type: "about:blank", Title: title, Status: status, Detail: detail})
	return events.APIGatewayV2HTTPResponse{
		StatusCode: status,
		Headers:    map[string]string{"Content-Type": httplimit.ProblemContentType},
		Body:       string(body),
	}
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
