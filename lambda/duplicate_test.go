package lambda_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
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
			h := et.wrap(adapter(t, lambda.Config{Guard: guard(t, httplimit.GuardConfig{Limiter: rec, OnError: httplimit.FailOpen}), Key: apiKeyFn}), &ran)
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
	k, err := httplimit.APIKey(v)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestEventHeader(t *testing.T) {
	rest := &events.APIGatewayProxyRequest{
		Headers:           map[string]string{"x-api-key": "ignored: the multi-value map wins"},
		MultiValueHeaders: map[string][]string{"x-forwarded-for": {"192.0.2.1", "198.51.100.7"}, "X-Forwarded-For": {"192.0.2.1", "198.51.100.7"}, "accept": {"*/*"}},
	}
	h, err := lambda.EventHeader(rest)
	if err != nil {
		t.Fatal(err)
	}
	// Agreeing copies are one field: a doubled X-Forwarded-For would move
	// the right-most untrusted entry.
	if got := h.Values("X-Forwarded-For"); len(got) != 2 || got[0] != "192.0.2.1" || got[1] != "198.51.100.7" {
		t.Errorf("X-Forwarded-For %q", got)
	}
	if h.Get("X-Api-Key") != "" || h.Get("Accept") != "*/*" {
		t.Errorf("header %v", h)
	}
	h["Accept"][0] = "changed"
	if rest.MultiValueHeaders["accept"][0] != "*/*" {
		t.Error("the Header shares a slice with the event")
	}

	rest.MultiValueHeaders["X-FORWARDED-FOR"] = []string{"203.0.113.9"}
	if _, err := lambda.EventHeader(rest); !errors.Is(err, lambda.ErrConflictingHeader) || !errors.Is(err, ratekit.ErrInvalidRequest) {
		t.Errorf("conflicting multi-value copies: %v", err)
	}

	url := &events.LambdaFunctionURLRequest{Headers: map[string]string{"cookie": "a=1"}, Cookies: []string{"b=2", "c=3"}}
	h, err = lambda.EventHeader(url)
	if err != nil || len(h["Cookie"]) != 2 || h["Cookie"][1] != "b=2; c=3" {
		t.Errorf("cookies: %q, %v", h["Cookie"], err)
	}

	for _, ev := range []any{nil, events.APIGatewayV2HTTPRequest{}, &events.SQSEvent{}} {
		if _, err := lambda.EventHeader(ev); !errors.Is(err, ratekit.ErrInvalidConfig) {
			t.Errorf("EventHeader(%T): %v, want ErrInvalidConfig", ev, err)
		}
	}
}

// FuzzEventHeader: two header names and values; copies of one field under
// names that differ in case are refused exactly when their values differ,
// and otherwise every name reads back its value, the same on every call.
func FuzzEventHeader(f *testing.F) {
	f.Add("x-api-key", "a", "X-Api-Key", "b")
	f.Add("x-api-key", "a", "X-API-KEY", "a")
	f.Add("accept", "*/*", "x-api-key", "k")
	f.Add("", "", "\x00", "\xff")
	f.Fuzz(func(t *testing.T, n1, v1, n2, v2 string) {
		ev := &events.APIGatewayV2HTTPRequest{Headers: map[string]string{n1: v1, n2: v2}}
		first, ferr := lambda.EventHeader(ev)
		for i := 0; i < 4; i++ {
			h, err := lambda.EventHeader(ev)
			if (err == nil) != (ferr == nil) || (err == nil && h.Get(n1) != first.Get(n1)) {
				t.Fatalf("EventHeader differs between calls: %v / %v", err, ferr)
			}
		}
		conflict := n1 != n2 && http.CanonicalHeaderKey(n1) == http.CanonicalHeaderKey(n2) && v1 != v2
		if conflict {
			if !errors.Is(ferr, lambda.ErrConflictingHeader) {
				t.Fatalf("conflicting copies %q=%q, %q=%q: %v", n1, v1, n2, v2, ferr)
			}
			return
		}
		if ferr != nil {
			t.Fatalf("no conflict, error %v", ferr)
		}
		if n1 != n2 && first.Get(n1) != v1 {
			t.Fatalf("%q reads %q, want %q", n1, first.Get(n1), v1)
		}
		if first.Get(n2) != v2 {
			t.Fatalf("%q reads %q, want %q", n2, first.Get(n2), v2)
		}
	})
}
