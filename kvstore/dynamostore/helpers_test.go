package dynamostore_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/ratekit/ratekit/internal/testenv"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
)

// The tests run against dynalite (started by .ci/dynalite.sh) or, when
// RATEKIT_DYNAMODB_ENDPOINT names one, against AWS with the credentials of
// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, in
// AWS_REGION (us-east-1 by default). They share one table,
// RATEKIT_DYNAMODB_TABLE (ratekit_test by default), created when missing;
// every test writes under a key prefix of its own, and TTL removes the items.

// onAWS reports whether the tests run against a server that returns the
// item with a failed condition (ReturnValuesOnConditionCheckFailure), which
// dynalite does not implement.
func onAWS() bool {
	return strings.Contains(os.Getenv(testenv.DynamoDBEnv), "amazonaws.com")
}

func tableName() string {
	if v := os.Getenv("RATEKIT_DYNAMODB_TABLE"); v != "" {
		return v
	}
	return "ratekit_test"
}

// newClient returns a client of the test endpoint whose HTTP transport is
// wrapped by wrap (when not nil).
func newClient(t testing.TB, wrap func(http.RoundTripper) http.RoundTripper) *dynamodb.Client {
	t.Helper()
	endpoint := testenv.DynamoDBEndpoint(t)
	region := os.Getenv("AWS_REGION")
	if region == "" {
		region = "us-east-1"
	}
	creds := aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "ratekit tests"}
	if id := os.Getenv("AWS_ACCESS_KEY_ID"); id != "" {
		creds = aws.Credentials{AccessKeyID: id, SecretAccessKey: os.Getenv("AWS_SECRET_ACCESS_KEY"), SessionToken: os.Getenv("AWS_SESSION_TOKEN"), Source: "environment"}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// dynalite (Node's HTTP server) closes a connection idle for 5s, and a
	// request sent on it as it closes fails ("server closed idle
	// connection"): the Store rightly does not retry it, since it may have
	// been applied. An idle timeout below 5s did not avoid that on a loaded
	// machine (timers fire late), so tests use a connection per request;
	// benchmarks keep connections, as production does.
	if _, bench := t.(*testing.B); !bench {
		tr.DisableKeepAlives = true
	}
	tr.MaxIdleConnsPerHost = 256
	t.Cleanup(tr.CloseIdleConnections)
	var rt http.RoundTripper = tr
	if wrap != nil {
		rt = wrap(rt)
	}
	return dynamodb.New(dynamodb.Options{
		Region:       region,
		BaseEndpoint: aws.String(endpoint),
		Credentials:  aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) { return creds, nil }),
		HTTPClient:   &http.Client{Transport: rt},
	})
}

var tableOnce sync.Once

// table creates the shared test table once per test binary.
func table(t testing.TB) string {
	t.Helper()
	name := tableName()
	client := newClient(t, nil)
	var err error
	tableOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		err = dynamostore.CreateTable(ctx, client, name)
		if errors.Is(err, dynamostore.ErrNoTTL) && !onAWS() {
			err = nil // dynalite: the Store checks expiry itself
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// prefix returns a key prefix no other test uses.
func prefix(t testing.TB) string {
	b := make([]byte, 6)
	crand.Read(b)
	return "ratekit-test:" + strings.ReplaceAll(t.Name(), "/", ".") + ":" + hex.EncodeToString(b) + ":"
}

// newStore returns a Store on the test table under a fresh prefix, through
// client (a new one when nil), with cfg's other fields.
func newStore(t testing.TB, client *dynamodb.Client, cfg dynamostore.Config) *dynamostore.Store {
	t.Helper()
	cfg.Table = table(t)
	if cfg.Prefix == "" {
		cfg.Prefix = prefix(t)
	}
	if client == nil {
		client = newClient(t, nil)
	}
	s, err := dynamostore.New(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// counter is an http.RoundTripper that counts the requests of each
// DynamoDB operation it forwards.
type counter struct {
	next http.RoundTripper
	mu   sync.Mutex
	ops  map[string]int
}

func newCounter(next http.RoundTripper) http.RoundTripper {
	return &counter{next: next, ops: map[string]int{}}
}

func (c *counter) RoundTrip(r *http.Request) (*http.Response, error) {
	op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "DynamoDB_20120810.")
	c.mu.Lock()
	c.ops[op]++
	c.mu.Unlock()
	return c.next.RoundTrip(r)
}

// take returns the counts so far and resets them.
func (c *counter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	ops := c.ops
	c.ops = map[string]int{}
	return ops
}

// fault is an http.RoundTripper that injects what its fields say into the
// requests it forwards: a delay before each request, an outage (requests
// fail without being sent), lost responses (requests are sent and applied,
// then the response is dropped) and canned error answers.
type fault struct {
	next   http.RoundTripper
	delay  atomic.Int64 // nanoseconds before sending
	jitter atomic.Int64 // up to this many more nanoseconds, at random
	down   atomic.Bool  // fail without sending
	lose   atomic.Bool  // send, then drop the response
	// answer, when set, is returned instead of sending: an HTTP status and
	// a DynamoDB JSON error body.
	answer atomic.Pointer[cannedAnswer]
	sent   atomic.Int64 // requests that reached the server
}

type cannedAnswer struct {
	status int
	body   string
	count  *int // incremented for each answer, when not nil
}

var errInjected = errors.New("injected: connection refused")

func (f *fault) RoundTrip(r *http.Request) (*http.Response, error) {
	d := time.Duration(f.delay.Load())
	if j := f.jitter.Load(); j > 0 {
		d += time.Duration(rand.Int64N(j))
	}
	if d > 0 {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	if f.down.Load() {
		return nil, errInjected
	}
	if a := f.answer.Load(); a != nil {
		if a.count != nil {
			*a.count++
		}
		return &http.Response{
			StatusCode: a.status,
			Header:     http.Header{"Content-Type": {"application/x-amz-json-1.0"}},
			Body:       io.NopCloser(strings.NewReader(a.body)),
			Request:    r,
		}, nil
	}
	f.sent.Add(1)
	resp, err := f.next.RoundTrip(r)
	if err == nil && f.lose.Load() {
		resp.Body.Close()
		return nil, errors.New("injected: connection reset after the request was sent")
	}
	return resp, err
}
