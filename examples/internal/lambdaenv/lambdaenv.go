// Package lambdaenv tells a person who starts a Lambda function's binary
// outside AWS Lambda what to do instead, before aws-lambda-go's
// lambda.Start fails with "expected AWS Lambda environment variables
// [_LAMBDA_SERVER_PORT AWS_LAMBDA_RUNTIME_API] are not defined".
package lambdaenv

// RuntimeAPIEnv is the environment variable through which the Lambda
// runtime (and the runtime interface emulator) gives a custom runtime the
// address of its Runtime API.
const RuntimeAPIEnv = "AWS_LAMBDA_RUNTIME_API"

// rpcPortEnv is the variable of the retired go1.x runtime, which
// aws-lambda-go still serves when built without the lambda.norpc tag.
const rpcPortEnv = "_LAMBDA_SERVER_PORT"

// NotInLambdaError says that the process does not run under a Lambda
// runtime, and what to do instead.
type NotInLambdaError struct {
	// Hint says how to run the program locally.
	Hint string
}

func (e *NotInLambdaError) Error() string {
	return "not running in AWS Lambda (" + RuntimeAPIEnv + " is unset): " + e.Hint
}

// ExitCode is the exit status for this error: 2, a usage error.
const ExitCode = 2

// Check returns nil when getenv shows a Lambda runtime to serve (the
// Runtime API's address, or the go1.x runtime's port), and otherwise a
// *NotInLambdaError carrying hint.
func Check(getenv func(string) string, hint string) error {
	if getenv(RuntimeAPIEnv) != "" || getenv(rpcPortEnv) != "" {
		return nil
	}
	return &NotInLambdaError{Hint: hint}
}
