package lambdaenv

import (
	"errors"
	"testing"
)

func TestCheck(t *testing.T) {
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	err := Check(getenv, "run with -local to serve on localhost")
	var nl *NotInLambdaError
	if !errors.As(err, &nl) || err.Error() != "not running in AWS Lambda (AWS_LAMBDA_RUNTIME_API is unset): run with -local to serve on localhost" {
		t.Fatalf("outside Lambda: %v", err)
	}
	env[RuntimeAPIEnv] = "127.0.0.1:9001"
	if err := Check(getenv, "x"); err != nil {
		t.Fatalf("with the Runtime API: %v", err)
	}
	env = map[string]string{rpcPortEnv: "8001"}
	if err := Check(getenv, "x"); err != nil {
		t.Fatalf("on the go1.x runtime: %v", err)
	}
}
