package lambda_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/lambda"
)

// headerMap returns the header map of fixture name that the adapters read:
// multiValueHeaders when the fixture has it, headers otherwise.
func headerMap(name string) string {
	switch name {
	case "rest.json", "alb-multi.json":
		return "multiValueHeaders"
	}
	return "headers"
}

func setHeader(m map[string]any, field, name, value string) {
	if field == "multiValueHeaders" {
		obj(m, field)[name] = []any{value}
		return
	}
	obj(m, field)[name] = value
}

// An event with two copies of one header field under names that differ in
// case only (possible with a direct Invoke) and different values is refused
// with 400 on every event type, before the limiter is asked, so that no
// handler can authenticate one copy while the other is charged. Copies with
// the same value are one field.
func TestConflictingHeaderCopies(t *testing.T) {
	types := eventTypes()
	types = append(types, eventType{"ALB-multi", "alb-multi.json", types[3].wrap})
	for _, et := range types {
		t.Run(et.name, func(t *testing.T) {
			rec := &recorder{}
			apiKeyFn, err := lambda.APIKeyHeaderKey("X-Api-Key")
			if err != nil {
				t.Fatal(err)
			}
			var ran atomic.Int64
			h := et.wrap(adapter(t, lambda.Config{Guard: guard(t, ratekit.GuardConfig{Limiter: rec, OnError: ratekit.FailOpen}), Key: apiKeyFn}), &ran)
			field := headerMap(et.fixture)
			conflicting := fixture(t, et.fixture, func(m map[string]any) {
				setHeader(m, field, "x-api-key", "customer-key")
				setHeader(m, field, "X-Api-Key", "invented-key")
			})
			for i := 0; i < 20; i++ { // map order varies between runs
				resp := invoke[anyResponse](t, context.Background(), h, conflicting)
				if resp.StatusCode != 400 || ran.Load() != 0 || len(rec.reqs) != 0 {
					t.Fatalf("conflicting copies: status %d %s, handler ran %d times, limiter asked %d times; want 400 and neither", resp.StatusCode, resp.Body, ran.Load(), len(rec.reqs))
				}
			}
			same := fixture(t, et.fixture, func(m map[string]any) {
				setHeader(m, field, "x-api-key", "customer-key")
				setHeader(m, field, "X-API-KEY", "customer-key")
			})
			if resp := invoke[anyResponse](t, context.Background(), h, same); resp.StatusCode != 200 {
				t.Fatalf("identical copies: status %d %s, want 200", resp.StatusCode, resp.Body)
			}
			if got, want := rec.last(t).Key, mustAPIKey(t, "customer-key"); got != want {
				t.Errorf("identical copies charged key %q, want %q", got, want)
			}
		})
	}
}

func mustAPIKey(t testing.TB, v string) string {
	t.Helper()
	k, err := ratekit.APIKey(v)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
