package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	awslambda "github.com/aws/aws-lambda-go/lambda"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/examples/internal/plans"
	"github.com/ratekit/ratekit/examples/internal/plans/planstest"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/internal/itest/faultproxy"
)

func TestPoolConfig(t *testing.T) {
	const dsn = "postgres://u@db.example/app?sslmode=require"
	tests := []struct {
		dsn         string
		concurrency int
		maxConns    int32
	}{
		{dsn, 1, 1}, // standard Lambda: one invocation at a time
		{dsn, 8, 8}, // managed instances running 8 at once
		{dsn + "&pool_max_conns=3", 8, 3},
	}
	for _, tc := range tests {
		cfg, err := poolConfig(tc.dsn, tc.concurrency)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.MaxConns != tc.maxConns || cfg.MinConns != 0 || cfg.PingTimeout != decisionTimeout/4 || cfg.MaxConnIdleTime != pgstore.ServerlessMaxConnIdleTime || cfg.ShouldPing == nil {
			t.Errorf("%s with %d: MaxConns %d MinConns %d PingTimeout %v MaxConnIdleTime %v",
				tc.dsn, tc.concurrency, cfg.MaxConns, cfg.MinConns, cfg.PingTimeout, cfg.MaxConnIdleTime)
		}
	}
	local, err := poolConfig(dsn, 0)
	if err != nil {
		t.Fatal(err)
	}
	if def, _ := pgxpool.ParseConfig(dsn); local.MaxConns != def.MaxConns {
		t.Errorf("local server: MaxConns %d, want pgxpool's default %d", local.MaxConns, def.MaxConns)
	}
	if _, err := poolConfig("postgres://u@db.example/app?pool_max_conns=x", 1); err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Errorf("bad DSN: %v", err)
	}
}

func unique(t testing.TB) string {
	b := make([]byte, 4)
	rand.Read(b)
	return "paidapi-test-" + hex.EncodeToString(b)
}

// testStore returns a Store on the test database that forgets the given
// API keys under prefix when the test ends.
func testStore(t testing.TB, prefix string, apiKeys ...string) *pgstore.Store {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), pgstoretest.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	store, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Every plan has the same two policies, so a Planned with any plan
		// forgets both counters and the idempotency records in one
		// statement; the quotas do not matter to a Reset.
		forget, err := durable.NewPlanned(durable.PlannedConfig{
			Store: store, Prefix: prefix, Durability: durable.Logged,
			Plan: func(context.Context, string) (ratekit.Plan, error) {
				return ratekit.Plan{Name: "any", Policies: []ratekit.Policy{
					{Name: plans.BurstPolicy, Quota: 1, Window: time.Second, Algorithm: ratekit.TokenBucket},
					{Name: plans.MonthlyPolicy, Quota: 1, Algorithm: ratekit.FixedWindow, Period: ratekit.Period{Unit: ratekit.Month}},
				}}, nil
			},
		})
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		for _, k := range apiKeys {
			if err := forget.Reset(context.Background(), mustAPIKey(k)); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		pool.Close()
	})
	return store
}

// testAPI returns an API on store under prefix whose customers are
// PAIDAPI_KEYS entries: the free plan is 3 calls a month, pro 5 and
// enterprise 50 a second, each with a burst of 50 calls a minute (so that a
// slow machine refills nothing between calls), unless change sets
// otherwise.
func testAPI(t testing.TB, store *pgstore.Store, prefix, keys string, change func(*config)) *api {
	t.Helper()
	m, err := plans.ParseKeys(keys)
	if err != nil {
		t.Fatal(err)
	}
	cust := plans.NewMemory(m)
	cfg := config{
		store: store, prefix: prefix, customers: cust,
		tiers:  plans.Tiers{Free: plans.Tier{Burst: 50, Quota: 3}, Pro: plans.Tier{Burst: 50, Quota: 5}, EnterpriseBurst: 50, BurstWindow: time.Minute},
		logger: slog.New(slog.DiscardHandler),
		quote:  func(context.Context, string) (float64, error) { return 1, nil },
	}
	if change != nil {
		change(&cfg)
	}
	a, err := newAPI(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The checks every paid API passes (planstest.Run), on PostgreSQL.
func TestPaidAPI(t *testing.T) {
	planstest.Run(t, func(t *testing.T, s planstest.Setup) awslambda.Handler {
		prefix := unique(t)
		store := testStore(t, prefix, keyNames(s.Keys)...)
		return awslambda.NewHandler(testAPI(t, store, prefix, s.Keys, func(c *config) {
			c.tiers, c.adminToken, c.quote = s.Tiers, s.AdminToken, s.Quote
		}).handler)
	})
}

// keyNames returns the API keys of PAIDAPI_KEYS entries.
func keyNames(keys string) []string {
	var names []string
	for _, e := range strings.Split(keys, ",") {
		names = append(names, strings.FieldsFunc(e, func(r rune) bool { return r == '=' || r == '@' })[0])
	}
	return names
}

func mustAPIKey(v string) string {
	k, err := httplimit.APIKey(v)
	if err != nil {
		panic(err)
	}
	return k
}

// burst is the number of concurrent calls that TestBurstIsExact makes; the
// issue asks for 3000 against a quota of 1000.
const burst, burstQuota = 3000, 1000

// A burst of 3000 concurrent calls from one API key, over real HTTP through
// the local server into the Lambda handler and PostgreSQL: exactly 1000
// succeed.
func TestBurstIsExact(t *testing.T) {
	prefix := unique(t)
	customer := "customer-" + prefix
	testStore(t, prefix, customer) // forgets the key afterwards
	env := map[string]string{"DATABASE_URL": pgstoretest.PostgresURL(t) + "&pool_max_conns=16", "PAIDAPI_KEYS": customer}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-local", "-addr", "127.0.0.1:0", "-prefix", prefix, "-quota", "1000", "-burst", "3000"},
			func(k string) string { return env[k] }, io.Discard, ready)
	}()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("server did not start: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}
	var ok, denied, other, retried atomic.Int64
	jobs := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	// A call that fails (503: on a busy machine the quota check can miss
	// the guard's 2s timeout, and may or may not have been counted) is
	// retried with its idempotency key, as a client of the API does, after
	// a pause that doubles up to a second, for up to a minute: the retry
	// counts at most once with the first attempt, so the totals stay
	// exact. Five retries at once were not enough with the machine's cores
	// busy elsewhere (10 of 3000 calls answered 503 five times in a row).
	const patience = time.Minute
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				status, header := 0, http.Header(nil)
				pause, giveUp := 10*time.Millisecond, time.Now().Add(patience)
				for attempt := 0; status != 200 && status != 429 && (attempt == 0 || time.Now().Before(giveUp)); attempt++ {
					if attempt > 0 {
						retried.Add(1)
						time.Sleep(pause)
						pause = min(2*pause, time.Second)
					}
					req, _ := http.NewRequest("GET", "http://"+addr+"/v1/quote?symbol=ACME", nil)
					req.Header.Set("X-Api-Key", customer)
					req.Header.Set("Idempotency-Key", prefix+"-"+strconv.Itoa(i))
					resp, err := client.Do(req)
					if err != nil {
						t.Error(err)
						break
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					status, header = resp.StatusCode, resp.Header
				}
				switch status {
				case 200:
					ok.Add(1)
				case 429:
					denied.Add(1)
				default:
					if other.Add(1) == 1 {
						t.Logf("first other answer: %d %s", status, header)
					}
				}
			}
		}()
	}
	for i := 0; i < burst; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	t.Logf("%d calls in %v: %d admitted, %d denied, %d other; %d retries", burst, time.Since(start).Round(time.Millisecond), ok.Load(), denied.Load(), other.Load(), retried.Load())
	if ok.Load() != burstQuota || denied.Load() != burst-burstQuota || other.Load() != 0 {
		t.Fatalf("admitted %d, denied %d, other %d; want exactly %d and %d", ok.Load(), denied.Load(), other.Load(), burstQuota, burst-burstQuota)
	}
}

// An event with two differently-cased copies of X-Api-Key (possible with a
// direct Invoke) must not authenticate one copy and charge the other: an
// invented key in the second copy would get a fresh quota on every call.
// The copies are refused with 400 unless they agree.
func TestDuplicateAPIKeyCopies(t *testing.T) {
	prefix := unique(t)
	customer := "customer-" + prefix
	store := testStore(t, prefix, customer)
	a := testAPI(t, store, prefix, customer, func(c *config) { c.tiers.Free.Quota = 1 })
	h := awslambda.NewHandler(a.handler)
	if r := planstest.Call(t, h, customer, "ACME", ""); r.Status != 200 {
		t.Fatalf("first call: %d %s", r.Status, r.Body)
	}
	for i := 0; i < 40; i++ { // the order of a map's names varies
		other := fmt.Sprintf("invented-%s-%d", prefix, i)
		r := planstest.CallWith(t, h, func(ev *events.APIGatewayV2HTTPRequest) {
			ev.Headers["x-api-key"] = customer
			ev.Headers["X-Api-Key"] = other
		})
		if r.Status != 400 {
			t.Fatalf("call %d with conflicting copies: %d %s, want 400", i, r.Status, r.Body)
		}
	}
	// Copies that agree are one key: the customer's, whose quota is spent.
	r := planstest.CallWith(t, h, func(ev *events.APIGatewayV2HTTPRequest) {
		ev.Headers["x-api-key"] = customer
		ev.Headers["X-API-KEY"] = customer
	})
	if r.Status != 429 {
		t.Fatalf("agreeing copies past the quota: %d %s, want 429", r.Status, r.Body)
	}
}

// A refund whose database stops answering must not outlive the invocation:
// with a function timeout shorter than the refund's own bound, the call
// used to end in "Task timed out". The refund ends DefaultDeadlineMargin
// before the invocation deadline and the 502 is answered in time (the call
// then stays charged).
func TestRefundWithinDeadline(t *testing.T) {
	prefix := unique(t)
	customer := "customer-" + prefix
	testStore(t, prefix, customer) // forgets the key afterwards
	pcfg, err := pgxpool.ParseConfig(pgstoretest.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := faultproxy.Start(t, net.JoinHostPort(pcfg.ConnConfig.Host, strconv.Itoa(int(pcfg.ConnConfig.Port))))
	host, port, _ := net.SplitHostPort(proxy.Listen)
	pcfg.ConnConfig.Host = host
	p, _ := strconv.Atoi(port)
	pcfg.ConnConfig.Port = uint16(p)
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	t.Cleanup(proxy.RemoveLatency) // before pool.Close: cleanups run last first
	store, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	a := testAPI(t, store, prefix, customer, func(c *config) {
		c.quote = func(context.Context, string) (float64, error) {
			proxy.Latency(time.Minute, 0) // the database stops answering
			return 0, errors.New("upstream failed")
		}
	})
	ev := mustEvent(t, customer)
	deadline := time.Now().Add(1500 * time.Millisecond) // a 1.5 s function timeout
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	out, err := awslambda.NewHandler(a.handler).Invoke(ctx, ev)
	if late := time.Since(deadline); err != nil || late >= 0 {
		t.Fatalf("Invoke returned %v after the invocation deadline (err %v): Task timed out", late, err)
	}
	var resp events.APIGatewayV2HTTPResponse
	if err := json.Unmarshal(out, &resp); err != nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("response %s (%v), want 502", out, err)
	}
}

func mustEvent(t *testing.T, apiKey string) []byte {
	t.Helper()
	raw, err := os.ReadFile("testdata/event.json")
	if err != nil {
		t.Fatal(err)
	}
	var ev events.APIGatewayV2HTTPRequest
	if err := json.Unmarshal(raw, &ev); err != nil {
		t.Fatal(err)
	}
	ev.Headers["x-api-key"] = apiKey
	payload, _ := json.Marshal(ev)
	return payload
}

// Each call is decided in one statement, both policies together: the
// composite's single round trip, where two limiters asked in turn took two.
func TestOneStatementPerCall(t *testing.T) {
	prefix := unique(t)
	customer := "customer-" + prefix
	store := testStore(t, prefix, customer) // forgets the key afterwards
	tr := &statementCounter{}
	cfg, err := pgxpool.ParseConfig(pgstoretest.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	traced, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	a := testAPI(t, traced, prefix, customer, func(c *config) { c.tiers.Free.Quota = 5 })
	h := awslambda.NewHandler(a.handler)
	if r := planstest.Call(t, h, customer, "ACME", ""); r.Status != 200 { // the first call checks the schema
		t.Fatalf("first call: %d %s", r.Status, r.Body)
	}
	tr.Statements.Store(0)
	for i := 0; i < 3; i++ {
		if r := planstest.Call(t, h, customer, "ACME", fmt.Sprint("idem-", i)); r.Status != 200 ||
			!strings.Contains(r.Header.Get("RateLimit"), fmt.Sprintf(`, "monthly";r=%d;t=`, 3-i)) {
			t.Fatalf("call %d: %d %v %s", i+2, r.Status, r.Header, r.Body)
		}
	}
	if n := tr.Statements.Load(); n != 3 {
		t.Fatalf("3 calls sent %d statements, want 3 (one per call for both policies)", n)
	}
}

// statementCounter is a pgx.QueryTracer that counts statements.
type statementCounter struct{ Statements atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.Statements.Add(1)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
