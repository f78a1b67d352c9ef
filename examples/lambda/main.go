// Command lambda is the smallest AWS Lambda function that ratekit protects: a
// function URL handler limited to 10 requests a minute per client IP by
// signedwindow, which stores nothing (the client carries a signed token in a
// cookie or the Ratekit-Token header). It links neither pgx nor go-redis.
//
// Build it for the provided.al2023 runtime as README.md shows:
//
//	GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go -C examples build -tags lambda.norpc -trimpath -ldflags='-s -w' -o "$PWD/bootstrap" ./lambda
//
// $RATEKIT_SECRET (at least 32 bytes, the same on every instance) signs the
// tokens.
//
// It has no local mode: started outside Lambda (AWS_LAMBDA_RUNTIME_API
// unset) it says how to try it instead (its tests, or the Lambda runtime
// interface emulator) and exits with status 2.
//
// Every decision is also written to standard output as a CloudWatch Embedded
// Metric Format line (lambda.NewEMFObserver), so CloudWatch shows the
// metrics Decisions, DecisionLatency and StoreErrors in the namespace
// "ratekit", by Policy, Operation and Outcome, with no agent and no API call.
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/aws/aws-lambda-go/events"
	awslambda "github.com/aws/aws-lambda-go/lambda"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/examples/internal/lambdaenv"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/lambda"
	"github.com/ratekit/ratekit/signedwindow"
)

// localHint says how to try the function without Lambda.
const localHint = "this example has no local mode; try it with `go -C examples test ./lambda`, " +
	"or run the binary under the Lambda runtime interface emulator (aws-lambda-rie)"

func main() {
	if err := lambdaenv.Check(os.Getenv, localHint); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", filepath.Base(os.Args[0]), err)
		os.Exit(lambdaenv.ExitCode)
	}
	// Built once per instance, in the init phase, and reused by every
	// invocation the instance serves.
	handler, err := newHandler(os.Getenv, os.Stdout)
	if err != nil {
		log.Fatal(err)
	}
	awslambda.Start(handler)
}

// newHandler returns the limited handler, which writes its metrics to
// metrics, or an error for a missing or short secret.
func newHandler(getenv func(string) string, metrics io.Writer) (lambda.FunctionURLHandler, error) {
	limiter, err := signedwindow.New(signedwindow.Config{
		Name:   "hello",
		Quota:  10,
		Window: time.Minute,
		Keys:   []signedwindow.Key{{ID: 1, Secret: []byte(getenv("RATEKIT_SECRET"))}},
	})
	if err != nil {
		return nil, fmt.Errorf("RATEKIT_SECRET: %w", err)
	}
	emf, err := lambda.NewEMFObserver(lambda.EMFConfig{Logger: slog.New(slog.NewJSONHandler(metrics, nil))})
	if err != nil {
		return nil, err
	}
	guard, err := httplimit.NewGuard(httplimit.GuardConfig{
		Limiter:  ratekit.Observe(limiter, emf),
		OnError:  httplimit.FailOpen,
		Observer: emf,
	})
	if err != nil {
		return nil, err
	}
	adapter, err := lambda.New(lambda.Config{Guard: guard, Key: lambda.SourceIPKey()})
	if err != nil {
		return nil, err
	}
	return adapter.FunctionURL(hello), nil
}

func hello(ctx context.Context, req events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
	d, _ := httplimit.DecisionFromContext(ctx)
	return events.LambdaFunctionURLResponse{
		StatusCode: 200,
		Headers:    map[string]string{"Content-Type": "text/plain; charset=utf-8"},
		Body:       fmt.Sprintf("Hello! %d of %d requests left this minute.\n", d.Remaining, d.Quota),
	}, nil
}
