package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	awslambda "github.com/aws/aws-lambda-go/lambda"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/examples/internal/plans/planstest"
)

// storeAt returns a Store whose pool connects to addr, which is not a
// PostgreSQL server.
func storeAt(t *testing.T, addr string) *pgstore.Store {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@"+addr+"/test?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// silentListener accepts connections on a loopback port and never answers
// them, like a PostgreSQL server that stopped answering; it closes them
// when the test ends.
func silentListener(t *testing.T) string {
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
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// usageEvent is GET /usage for apiKey as API Gateway sends it.
func usageEvent(t *testing.T, apiKey string) []byte {
	t.Helper()
	var ev events.APIGatewayV2HTTPRequest
	if err := json.Unmarshal(mustEvent(t, apiKey), &ev); err != nil {
		t.Fatal(err)
	}
	ev.RawPath, ev.RequestContext.HTTP.Method, ev.RequestContext.HTTP.Path = "/usage", "GET", "/usage"
	ev.QueryStringParameters, ev.RawQueryString = nil, ""
	payload, _ := json.Marshal(ev)
	return payload
}

// GET /usage against a PostgreSQL that never answers must end within the
// invocation, as a metered call does: with a 1 s function timeout it used
// to wait its own 2 s and end in "Task timed out" and an instance reset.
func TestUsageWithinDeadline(t *testing.T) {
	a := testAPI(t, storeAt(t, silentListener(t)), unique(t), "customer", nil)
	deadline := time.Now().Add(time.Second) // a 1 s function timeout
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	out, err := awslambda.NewHandler(a.handler).Invoke(ctx, usageEvent(t, "customer"))
	if late := time.Since(deadline); err != nil || late >= 0 {
		t.Fatalf("GET /usage returned %v after the invocation deadline (err %v): Task timed out", late, err)
	}
	var resp events.APIGatewayV2HTTPResponse
	if err := json.Unmarshal(out, &resp); err != nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Headers["Retry-After"] == "" {
		t.Fatalf("response %s (%v), want 503 with Retry-After", out, err)
	}
}

// Twenty failing GET /usage calls log one line, as twenty failing metered
// calls do (the outage reporter), where they used to log twenty.
func TestUsageFailuresLoggedOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: every connection is refused
	var log bytes.Buffer
	a := testAPI(t, storeAt(t, addr), unique(t), "customer", func(c *config) {
		c.logger = slog.New(slog.NewJSONHandler(&log, nil))
	})
	h := awslambda.NewHandler(a.handler)
	const calls = 20
	for i := 0; i < calls; i++ {
		if r := planstest.Request(t, h, "GET", "/usage", "customer", ""); r.Status != http.StatusServiceUnavailable {
			t.Fatalf("call %d: %d %s, want 503", i, r.Status, r.Body)
		}
	}
	var lines []string
	for line := range strings.Lines(log.String()) {
		var m struct{ Level, Msg, Error string }
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m.Level == "ERROR" {
			lines = append(lines, line)
			if !strings.HasPrefix(m.Msg, "PostgreSQL failed") || m.Error == "" {
				t.Errorf("failure line %s: want the outage reporter's line with the cause", line)
			}
		}
	}
	if len(lines) != 1 {
		t.Errorf("%d failing GET /usage calls logged %d ERROR lines, want 1:\n%s", calls, len(lines), log.String())
	}
}

// Expired idempotency records are deleted by the API itself: a call's
// record used to stay in the table forever.
func TestCleanupDeletesIdempotencyRecords(t *testing.T) {
	prefix := unique(t)
	customer := "customer-" + prefix
	store := testStore(t, prefix, customer)
	pool, err := pgxpool.New(context.Background(), pgstoretest.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	records := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(context.Background(),
			`SELECT count(*) FROM "ratekit".idempotency WHERE prefix = $1`, prefix).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	h := awslambda.NewHandler(testAPI(t, store, prefix, customer, nil).handler)
	for i := 0; i < 3; i++ {
		if r := planstest.Call(t, h, customer, "ACME", "order-"+string(rune('a'+i))); r.Status != 200 {
			t.Fatalf("call %d: %d %s", i, r.Status, r.Body)
		}
	}
	if n := records(); n != 3 {
		t.Fatalf("%d idempotency records after 3 calls with an Idempotency-Key, want 3", n)
	}
	// 32 days later: the records have expired.
	if _, err := pool.Exec(context.Background(),
		`UPDATE "ratekit".idempotency SET expires_at_us = 0 WHERE prefix = $1`, prefix); err != nil {
		t.Fatal(err)
	}
	// A new instance cleans up on its first answered request.
	h = awslambda.NewHandler(testAPI(t, store, prefix, customer, nil).handler)
	planstest.UsageOf(t, h, customer)
	if n := records(); n != 0 {
		t.Fatalf("%d expired idempotency records left after a request, want 0", n)
	}
}

// The cleanup runs at most once per interval in an instance, and not at all
// when turned off.
func TestCleanupInterval(t *testing.T) {
	var runs int
	c := &cleaner{every: time.Minute, log: slog.New(slog.DiscardHandler),
		run: func(context.Context) (int64, error) { runs++; return 0, nil }}
	now := time.Now()
	ctx := context.Background()
	for _, d := range []time.Duration{0, time.Second, 59 * time.Second, time.Minute, time.Minute + time.Second, 2 * time.Minute} {
		c.maybe(ctx, now.Add(d))
	}
	if runs != 3 {
		t.Errorf("%d cleanups in 2 minutes at most one a minute, want 3 (at 0, 1 min and 2 min)", runs)
	}
	past, cancel := context.WithDeadline(ctx, now)
	defer cancel()
	c.maybe(past, now.Add(time.Hour))
	if runs != 3 {
		t.Errorf("a cleanup ran for a request past its deadline")
	}
	off := &cleaner{every: -1, run: func(context.Context) (int64, error) { runs++; return 0, nil }}
	off.maybe(ctx, now)
	if runs != 3 {
		t.Errorf("a cleanup turned off ran")
	}
}
