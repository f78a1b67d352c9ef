// Command baseline is examples/lambda without ratekit: the same function URL
// handler and the same runtime library, so that the size and start-up time
// of the two binaries show what ratekit adds. It also says, as the example
// does, when it is started outside Lambda. Build it exactly like the example
// (see ../README.md).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/aws/aws-lambda-go/events"
	awslambda "github.com/aws/aws-lambda-go/lambda"

	"github.com/ratekit/ratekit/examples/internal/lambdaenv"
)

func main() {
	if err := lambdaenv.Check(os.Getenv, "this is a baseline for measurements; see examples/lambda/README.md"); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", filepath.Base(os.Args[0]), err)
		os.Exit(lambdaenv.ExitCode)
	}
	awslambda.Start(hello)
}

func hello(ctx context.Context, req events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
	return events.LambdaFunctionURLResponse{
		StatusCode: 200,
		Headers:    map[string]string{"Content-Type": "text/plain; charset=utf-8"},
		Body:       fmt.Sprintf("Hello! %d of %d requests left this minute.\n", 10, 10),
	}, nil
}
