package lambda_test

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	awslambda "github.com/aws/aws-lambda-go/lambda"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/kvstore/memstore"
	"github.com/ratekit/ratekit/lambda"
	"github.com/ratekit/ratekit/tokenbucket"
)

// composite is ratekit.All over a burst of 2 a second and 3 a day, token
// buckets in memory on c.
func composite(t testing.TB, c *clock) ratekit.Limiter {
	t.Helper()
	store, err := memstore.New(memstore.Config{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	bucket := func(name string, n int64, per time.Duration) ratekit.Limiter {
		l, err := tokenbucket.New(tokenbucket.Config{
			Name: name, Burst: n, RefillRate: tokenbucket.Rate{Tokens: n, Per: per},
			Mode: tokenbucket.Atomic, Store: store, Now: c.Now,
		})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	l, err := ratekit.All(bucket("burst", 2, time.Second), bucket("daily", 3, 24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// headersOf reads the response header fields of any event type's response
// (headers and multiValueHeaders).
func headersOf(t testing.TB, out []byte) http.Header {
	t.Helper()
	var resp struct {
		Headers map[string]string   `json:"headers"`
		Multi   map[string][]string `json:"multiValueHeaders"`
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	for k, v := range resp.Headers {
		h.Set(k, v)
	}
	for k, vs := range resp.Multi {
		h.Del(k)
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	return h
}

// TestCompositeEveryEventType: on every event type, a composite's decision
// shows both policies in the RateLimit fields, and its denial names the
// policy that denied.
func TestCompositeEveryEventType(t *testing.T) {
	for _, et := range eventTypes() {
		t.Run(et.name, func(t *testing.T) {
			c := newClock()
			var ran atomic.Int64
			h := et.wrap(adapter(t, lambda.Config{Guard: guard(t, httplimit.GuardConfig{Limiter: composite(t, c), OnError: httplimit.FailClosed}), Key: constantKey}), &ran)
			payload := fixture(t, et.fixture, nil)
			call := func() (anyResponse, http.Header) {
				out, err := awslambdaInvoke(h, payload)
				if err != nil {
					t.Fatal(err)
				}
				var resp anyResponse
				if err := json.Unmarshal(out, &resp); err != nil {
					t.Fatal(err)
				}
				return resp, headersOf(t, out)
			}
			resp, hdr := call()
			if resp.StatusCode != 200 || hdr.Get("RateLimit-Policy") != `"burst";q=2;w=1, "daily";q=3;w=86400` ||
				hdr.Get("RateLimit") != `"burst";r=1;t=1, "daily";r=2;t=28800` {
				t.Fatalf("first answer: %d %v", resp.StatusCode, hdr)
			}
			call()
			resp, hdr = call() // the burst is used up
			if resp.StatusCode != 429 || hdr.Get("Retry-After") != "1" ||
				!reflect.DeepEqual(problemOf(t, resp.Body).ViolatedPolicies, []string{"burst"}) ||
				hdr.Get("RateLimit") != `"burst";r=0;t=1, "daily";r=1;t=28800` { // the daily bucket's next unit in 8h
				t.Fatalf("third answer: %d %v %s", resp.StatusCode, hdr, resp.Body)
			}
			c.Add(time.Second)
			call()
			resp, hdr = call() // the day is used up, the burst is not
			if resp.StatusCode != 429 || !reflect.DeepEqual(problemOf(t, resp.Body).ViolatedPolicies, []string{"daily"}) {
				t.Fatalf("fifth answer: %d %v %s", resp.StatusCode, hdr, resp.Body)
			}
			if n := ran.Load(); n != 3 {
				t.Errorf("the handler ran %d times, want 3", n)
			}
		})
	}
}

func awslambdaInvoke(handler any, payload []byte) ([]byte, error) {
	return awslambda.NewHandler(handler).Invoke(context.Background(), payload)
}
