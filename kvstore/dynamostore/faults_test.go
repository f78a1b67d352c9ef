package dynamostore_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/kvstore"
	"github.com/ratekit/ratekit/kvstore/dynamostore"
	"github.com/ratekit/ratekit/limitertest"
	"github.com/ratekit/ratekit/tokenbucket"
)

// faultyStore returns a Store whose client sends through a fault injector.
func faultyStore(t *testing.T, cfg dynamostore.Config) (*dynamostore.Store, *fault) {
	t.Helper()
	var f *fault
	client := newClient(t, func(rt http.RoundTripper) http.RoundTripper { f = &fault{next: rt}; return f })
	return newStore(t, client, cfg), f
}

// slowRefill refills 10 units of 1e9 in 10,000 seconds.
const unit = 1_000_000_000

var slowRefill = kvstore.Refill{Burst: 10 * unit, Rate: 1}

// allowWithin calls Update (a take) with a deadline of d and returns its
// error and how long it took.
func takeWithin(s *dynamostore.Store, d time.Duration) (kvstore.OpResult, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	res, err := s.Update(ctx, "k", kvstore.Refill{Burst: 1e9, Rate: 1}, kvstore.OpTake, 1)
	return res, time.Since(start), err
}

// TestOutage: while requests fail to connect, Update fails at once, with
// the transport's error visible, and works again when they connect.
func TestOutage(t *testing.T) {
	s, f := faultyStore(t, dynamostore.Config{})
	if _, _, err := takeWithin(s, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	f.down.Store(true)
	for i := 0; i < 3; i++ {
		res, took, err := takeWithin(s, 500*time.Millisecond)
		if !errors.Is(err, errInjected) || res != (kvstore.OpResult{}) {
			t.Fatalf("Update during an outage = %+v, %v; want the transport's error", res, err)
		}
		if took > 400*time.Millisecond {
			t.Fatalf("Update during an outage took %v", took)
		}
	}
	f.down.Store(false)
	if _, _, err := takeWithin(s, 5*time.Second); err != nil {
		t.Fatalf("no recovery after the outage: %v", err)
	}
}

// TestLatencyBeyondDeadline: a store slower than the caller's deadline
// gives an error matching context.DeadlineExceeded, at the deadline.
func TestLatencyBeyondDeadline(t *testing.T) {
	s, f := faultyStore(t, dynamostore.Config{})
	f.delay.Store(int64(2 * time.Second))
	res, took, err := takeWithin(s, 200*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) || res != (kvstore.OpResult{}) {
		t.Fatalf("Update with 2s latency and a 200ms deadline = %+v, %v; want context.DeadlineExceeded", res, err)
	}
	if took > 600*time.Millisecond {
		t.Fatalf("Update took %v with a 200ms deadline", took)
	}
}

// TestSilentServer: a server that accepts connections and never answers
// (a dead NAT flow, a frozen peer) costs the caller its deadline, no more.
func TestSilentServer(t *testing.T) {
	s := silentStore(t)
	for i := 0; i < 2; i++ {
		_, took, err := takeWithin(s, 200*time.Millisecond)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Update on a silent server: %v; want context.DeadlineExceeded", err)
		}
		if took > 600*time.Millisecond {
			t.Fatalf("Update on a silent server took %v with a 200ms deadline", took)
		}
	}
}

// TestLostResponseIsNotRetried: a take whose response is lost after
// DynamoDB applied it is an error, and is not sent again (the SDK's
// retryer would take twice).
func TestLostResponseIsNotRetried(t *testing.T) {
	s, f := faultyStore(t, dynamostore.Config{})
	f.lose.Store(true)
	if _, err := s.Update(context.Background(), "k", slowRefill, kvstore.OpTake, 3*unit); err == nil {
		t.Fatal("Update with a lost response: nil error")
	}
	f.lose.Store(false)
	if n := f.sent.Load(); n != 1 {
		t.Fatalf("%d requests sent for one take whose response was lost; want 1", n)
	}
	if rec, ok, err := s.Get(context.Background(), "k"); err != nil || !ok || rec.Value != 7*unit {
		t.Fatalf("after the lost take: Get = %+v, %v, %v; want the take applied once (7)", rec, ok, err)
	}
}

// TestServerErrors: throttling, refused credentials and internal errors are
// returned at once, matching the SDK's error types, and sent once.
func TestServerErrors(t *testing.T) {
	for _, tc := range []struct {
		status int
		typ    string
		check  func(error) bool
	}{
		{400, "ProvisionedThroughputExceededException", func(err error) bool {
			var e *types.ProvisionedThroughputExceededException
			return errors.As(err, &e)
		}},
		{400, "ThrottlingException", nil},
		{400, "UnrecognizedClientException", nil},
		{500, "InternalServerError", func(err error) bool {
			var e *types.InternalServerError
			return errors.As(err, &e)
		}},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			s, f := faultyStore(t, dynamostore.Config{})
			var attempts int
			f.answer.Store(&cannedAnswer{status: tc.status, body: `{"__type":"com.amazonaws.dynamodb.v20120810#` + tc.typ + `","message":"injected"}`, count: &attempts})
			for _, op := range []kvstore.Op{kvstore.OpTake, kvstore.OpPeek, kvstore.OpRefund} {
				attempts = 0
				_, err := s.Update(context.Background(), "k", slowRefill, op, 1)
				var api smithy.APIError
				if !errors.As(err, &api) || api.ErrorCode() != tc.typ || (tc.check != nil && !tc.check(err)) {
					t.Fatalf("op %d: Update = %v; want the %s error", op, err, tc.typ)
				}
				if attempts != 1 {
					t.Fatalf("op %d: %d requests sent; want 1 (no retries)", op, attempts)
				}
			}
			if _, _, err := s.Get(context.Background(), "k"); err == nil {
				t.Fatal("Get: nil error")
			}
		})
	}
}

// TestMissingTable: a table that does not exist is an error matching
// *types.ResourceNotFoundException, for every method.
func TestMissingTable(t *testing.T) {
	s, err := dynamostore.New(newClient(t, nil), dynamostore.Config{Table: "ratekit_no_such_table"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	missing := func(err error) bool {
		var e *types.ResourceNotFoundException
		return errors.As(err, &e)
	}
	if _, _, err := s.Get(ctx, "k"); !missing(err) {
		t.Errorf("Get: %v", err)
	}
	if err := s.Set(ctx, "k", kvstore.Record{}, time.Minute); !missing(err) {
		t.Errorf("Set: %v", err)
	}
	if err := s.Delete(ctx, "k"); !missing(err) {
		t.Errorf("Delete: %v", err)
	}
	if _, err := s.Update(ctx, "k", slowRefill, kvstore.OpTake, 1); !missing(err) {
		t.Errorf("Update: %v", err)
	}
}

// TestHistory has 16 workers make decisions on three keys for 2 seconds (or
// until the limit and the faults have shown), each with a deadline of two
// seconds, through a transport that adds 0–2ms
// of latency, fails every request for 20ms out of every 250ms, and in
// another 20ms loses the responses of requests it sent (DynamoDB applied
// them; the caller sees an error). The history of admitted requests must
// fit the token bucket's bound over every span of time (Atomic), or that
// bound times the workers (Eventual).
func TestHistory(t *testing.T) {
	const workers, runFor, skew = 16, 2 * time.Second, 2 * time.Millisecond
	keys := []string{"alpha", "beta", "gamma"}
	for _, mode := range []tokenbucket.Mode{tokenbucket.Atomic, tokenbucket.Eventual} {
		t.Run(mode.String(), func(t *testing.T) {
			s, f := faultyStore(t, dynamostore.Config{})
			// Burst 5 refilled 5 a second: dynalite parses every update
			// expression in JavaScript, and on a loaded machine serves some
			// tens of conditional updates a second; the limit must bind.
			l := newLimiter(t, tokenbucket.Config{Name: "history", Burst: 5, RefillRate: tokenbucket.PerSecond(5), Mode: mode, Store: s})
			stop := make(chan struct{})
			var faults sync.WaitGroup
			faults.Go(func() {
				tick := time.NewTicker(250 * time.Millisecond)
				defer tick.Stop()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					flag := &f.down
					if i%2 == 1 {
						flag = &f.lose
					}
					flag.Store(true)
					time.Sleep(20 * time.Millisecond)
					flag.Store(false)
				}
			})
			f.jitter.Store(int64(2 * time.Millisecond))
			var h limitertest.History
			// At least runFor, and until the run has seen the limit bind
			// and the faults strike (dynalite on a loaded machine can be
			// slow to get there), at most a minute.
			start := time.Now()
			done := func() bool {
				if time.Since(start) > time.Minute {
					return true
				}
				return time.Since(start) > runFor && h.Count(limitertest.Admitted) >= 10 &&
					h.Count(limitertest.Denied) >= 10 && h.Count(limitertest.Failed) >= 1
			}
			var wg sync.WaitGroup
			for w := 0; w < workers; w++ {
				wg.Go(func() {
					for i := 0; !done(); i++ {
						ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
						h.Allow(ctx, l, ratekit.Request{Key: keys[(w+i)%len(keys)], Cost: 1})
						cancel()
					}
				})
			}
			wg.Wait()
			close(stop)
			faults.Wait()
			admitted, denied, failed := h.Count(limitertest.Admitted), h.Count(limitertest.Denied), h.Count(limitertest.Failed)
			t.Logf("%d admitted, %d denied, %d failed in %v", admitted, denied, failed, time.Since(start).Round(time.Millisecond))
			if admitted < 10 || denied < 10 || failed < 1 {
				t.Fatalf("the run did not exercise the limit and the faults: %d admitted, %d denied, %d failed", admitted, denied, failed)
			}
			bound := limitertest.TokenBucketBound(5, 5, time.Second, skew)
			if mode == tokenbucket.Eventual {
				one := bound
				bound = func(a, b time.Time) int64 { return workers * one(a, b) }
			}
			if err := h.Check(bound); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// silentStore returns a Store whose endpoint accepts connections and never
// reads or answers them (no FIN, no RST).
func silentStore(t *testing.T) *dynamostore.Store {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never read or answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	client := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String("http://" + ln.Addr().String()),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "a", SecretAccessKey: "b"}, nil
		}),
	})
	s, err := dynamostore.New(client, dynamostore.Config{Table: "t"})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
