package lambda_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	awslambda "github.com/aws/aws-lambda-go/lambda"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/lambda"
)

// blocking is a Limiter whose store does not answer: each call waits until
// its context ends. It records the deadline of each call.
type blocking struct {
	calls     atomic.Int64
	mu        sync.Mutex
	deadlines []time.Time
}

func (b *blocking) Allow(ctx context.Context, _ ratekit.Request) (ratekit.Decision, error) {
	b.calls.Add(1)
	dl, _ := ctx.Deadline()
	b.mu.Lock()
	b.deadlines = append(b.deadlines, dl)
	b.mu.Unlock()
	<-ctx.Done()
	return ratekit.Decision{}, ctx.Err()
}

// eventType is one of the four wrappers with a fixture and a handler that
// counts its runs.
type eventType struct {
	name    string
	fixture string
	wrap    func(a *lambda.Adapter, ran *atomic.Int64) any
}

func eventTypes() []eventType {
	return []eventType{
		{"REST", "rest.json", func(a *lambda.Adapter, ran *atomic.Int64) any {
			return a.REST(func(context.Context, events.APIGatewayProxyRequest) (events.APIGatewayProxyResponse, error) {
				ran.Add(1)
				return events.APIGatewayProxyResponse{StatusCode: 200}, nil
			})
		}},
		{"HTTPAPI", "httpapi.json", func(a *lambda.Adapter, ran *atomic.Int64) any {
			return a.HTTPAPI(func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
				ran.Add(1)
				return events.APIGatewayV2HTTPResponse{StatusCode: 200}, nil
			})
		}},
		{"FunctionURL", "functionurl.json", func(a *lambda.Adapter, ran *atomic.Int64) any {
			return a.FunctionURL(func(context.Context, events.LambdaFunctionURLRequest) (events.LambdaFunctionURLResponse, error) {
				ran.Add(1)
				return events.LambdaFunctionURLResponse{StatusCode: 200}, nil
			})
		}},
		{"ALB", "alb-single.json", func(a *lambda.Adapter, ran *atomic.Int64) any {
			return a.ALB(func(context.Context, events.ALBTargetGroupRequest) (events.ALBTargetGroupResponse, error) {
				ran.Add(1)
				return events.ALBTargetGroupResponse{StatusCode: 200}, nil
			})
		}},
	}
}

// anyResponse is the part every response type shares in JSON.
type anyResponse struct {
	StatusCode int    `json:"statusCode"`
	Body       string `json:"body"`
}

func constantKey(context.Context, *lambda.Request) (string, error) { return "k", nil }

// A caller that gave up is no limiter failure: on every event type, under
// FailOpen and UseFallback, the handler does not run and the fallback is not
// asked when the invocation's context has ended.
func TestCallerGoneEveryEventType(t *testing.T) {
	for _, et := range eventTypes() {
		for _, policy := range []httplimit.FailurePolicy{httplimit.FailOpen, httplimit.UseFallback} {
			t.Run(et.name+"/"+policy.String(), func(t *testing.T) {
				primary, fallback := &blocking{}, &recorder{}
				cfg := httplimit.GuardConfig{Limiter: primary, OnError: policy}
				if policy == httplimit.UseFallback {
					cfg.Fallback = fallback
				}
				var ran atomic.Int64
				h := et.wrap(adapter(t, lambda.Config{Guard: guard(t, cfg), Key: constantKey}), &ran)
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				resp := invoke[anyResponse](t, ctx, h, fixture(t, et.fixture, nil))
				if n := ran.Load(); n != 0 || resp.StatusCode == 200 {
					t.Errorf("status %d, handler ran %d times for a caller that gave up", resp.StatusCode, n)
				}
				fallback.mu.Lock()
				n := len(fallback.reqs)
				fallback.mu.Unlock()
				if n != 0 {
					t.Errorf("the fallback was asked %d times for a caller that gave up", n)
				}
			})
		}
	}
}

// A store that does not answer ends, on every event type, in the Guard's
// 503 before the invocation deadline, on aws-lambda-go's own Invoke path:
// each limiter call ends DefaultDeadlineMargin before the deadline even
// though Guard.Timeout is longer than the time left; with UseFallback the
// fallback is asked in time too.
func TestDeadlineEveryEventType(t *testing.T) {
	const left = 1200 * time.Millisecond
	for _, et := range eventTypes() {
		for _, policy := range []httplimit.FailurePolicy{httplimit.FailClosed, httplimit.UseFallback} {
			t.Run(et.name+"/"+policy.String(), func(t *testing.T) {
				t.Parallel()
				primary, fallback := &blocking{}, &blocking{}
				cfg := httplimit.GuardConfig{Limiter: primary, OnError: policy, Timeout: 2 * time.Second}
				if policy == httplimit.UseFallback {
					cfg.Fallback = fallback
				}
				var ran atomic.Int64
				h := et.wrap(adapter(t, lambda.Config{Guard: guard(t, cfg), Key: constantKey}), &ran)
				deadline := time.Now().Add(left)
				ctx, cancel := context.WithDeadline(context.Background(), deadline)
				defer cancel()
				out, err := awslambda.NewHandler(h).Invoke(ctx, fixture(t, et.fixture, nil))
				if err != nil || ctx.Err() != nil {
					t.Fatalf("Invoke returned %v after the deadline (%v, err %v): Task timed out", time.Since(deadline), ctx.Err(), err)
				}
				var resp anyResponse
				decodeInto(t, out, &resp)
				if resp.StatusCode != 503 || ran.Load() != 0 {
					t.Fatalf("status %d %s, handler ran %d times; want 503", resp.StatusCode, resp.Body, ran.Load())
				}
				if p := problemOf(t, resp.Body); p.Type != httplimit.ProblemTypeTemporaryReducedCapacity {
					t.Errorf("problem %+v", p)
				}
				latest := deadline.Add(-httplimit.DefaultDeadlineMargin)
				for name, l := range map[string]*blocking{"limiter": primary, "fallback": fallback} {
					if name == "fallback" && policy != httplimit.UseFallback {
						continue
					}
					l.mu.Lock()
					dls := append([]time.Time(nil), l.deadlines...)
					l.mu.Unlock()
					if len(dls) != 1 {
						t.Fatalf("%s asked %d times, want once", name, len(dls))
					}
					if dls[0].IsZero() || dls[0].After(latest) {
						t.Errorf("%s deadline %v after the deadline minus the margin", name, dls[0].Sub(latest))
					}
				}
			})
		}
	}
}

func decodeInto(t *testing.T, out []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("response %s: %v", out, err)
	}
}
