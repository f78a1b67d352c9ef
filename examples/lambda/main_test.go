package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	awslambda "github.com/aws/aws-lambda-go/lambda"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
)

func env(k string) string {
	if k == "RATEKIT_SECRET" {
		return "0123456789abcdef0123456789abcdef-example"
	}
	return ""
}

// The handler runs through aws-lambda-go's own invoke path with a real
// function URL event; the client keeps the cookie it is given.
func TestHandlerLimitsPerClient(t *testing.T) {
	var metrics bytes.Buffer
	h, err := newHandler(env, &metrics)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("testdata/event.json")
	if err != nil {
		t.Fatal(err)
	}
	lh := awslambda.NewHandler(h)
	var cookie string
	for i := 1; i <= 11; i++ {
		var ev map[string]any
		if err := json.Unmarshal(raw, &ev); err != nil {
			t.Fatal(err)
		}
		if cookie != "" {
			ev["cookies"] = []string{"theme=dark", cookie}
		}
		payload, _ := json.Marshal(ev)
		out, err := lh.Invoke(context.Background(), payload)
		if err != nil {
			t.Fatal(err)
		}
		var resp events.LambdaFunctionURLResponse
		if err := json.Unmarshal(out, &resp); err != nil {
			t.Fatal(err)
		}
		for _, line := range resp.Cookies {
			if c, err := http.ParseSetCookie(line); err == nil && c.Name == httplimit.DefaultStateCookie {
				cookie = c.Name + "=" + c.Value
			}
		}
		if i <= 10 {
			if resp.StatusCode != 200 || !strings.Contains(resp.Body, "of 10 requests left") {
				t.Fatalf("request %d: %d %s", i, resp.StatusCode, resp.Body)
			}
			continue
		}
		if resp.StatusCode != 429 || resp.Headers["Retry-After"] == "" || resp.Headers["Content-Type"] != httplimit.ProblemContentType {
			t.Fatalf("request 11: %d %v %s", resp.StatusCode, resp.Headers, resp.Body)
		}
	}
	// One EMF line per decision: 10 admitted, 1 denied.
	outcomes := map[string]int{}
	for line := range strings.Lines(metrics.String()) {
		var m struct {
			AWS struct {
				CloudWatchMetrics []struct{ Namespace string }
			} `json:"_aws"`
			Policy, Outcome string
			Decisions       int
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		if len(m.AWS.CloudWatchMetrics) != 1 || m.AWS.CloudWatchMetrics[0].Namespace != "ratekit" || m.Policy != "hello" || m.Decisions != 1 {
			t.Fatalf("metric line %s", line)
		}
		outcomes[m.Outcome]++
	}
	if outcomes["allowed"] != 10 || outcomes["denied"] != 1 || len(outcomes) != 2 {
		t.Fatalf("EMF outcomes %v, want 10 allowed and 1 denied", outcomes)
	}
}

func TestHandlerNeedsASecret(t *testing.T) {
	for _, secret := range []string{"", "too short"} {
		_, err := newHandler(func(string) string { return secret }, io.Discard)
		if !errors.Is(err, ratekit.ErrInvalidConfig) || !strings.Contains(err.Error(), "RATEKIT_SECRET") {
			t.Errorf("secret %q: %v", secret, err)
		}
	}
}

// BenchmarkNewHandler measures what ratekit adds to the init phase: building
// the limiter (HKDF key derivation), the Guard and the adapter.
func BenchmarkNewHandler(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := newHandler(env, io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}

// Started outside Lambda, the binary says in one line how to try it instead
// and exits 2, rather than aws-lambda-go's "expected AWS Lambda environment
// variables ... are not defined".
func TestNotInLambda(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "bootstrap")
	if out, err := exec.Command("go", "build", "-tags", "lambda.norpc", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AWS_LAMBDA_RUNTIME_API=") && !strings.HasPrefix(kv, "_LAMBDA_SERVER_PORT=") {
			env = append(env, kv)
		}
	}
	env = append(env, "RATEKIT_SECRET=0123456789abcdef0123456789abcdef-example")
	cmd := exec.Command(bin)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 ||
		!strings.HasPrefix(string(out), "bootstrap: not running in AWS Lambda (AWS_LAMBDA_RUNTIME_API is unset): ") ||
		!strings.Contains(string(out), "go -C examples test ./lambda") || strings.Count(string(out), "\n") != 1 {
		t.Fatalf("outside Lambda: %v, output %q; want exit status 2 and a one-line hint", err, out)
	}

	// With the variable set, the hint stays silent and aws-lambda-go takes
	// over (here it finds no Runtime API at the address and gives up).
	cmd = exec.Command(bin)
	cmd.Env = append(env, "AWS_LAMBDA_RUNTIME_API=127.0.0.1:1")
	out, _ = cmd.CombinedOutput()
	if strings.Contains(string(out), "not running in AWS Lambda") {
		t.Fatalf("with AWS_LAMBDA_RUNTIME_API set: %q", out)
	}
}
