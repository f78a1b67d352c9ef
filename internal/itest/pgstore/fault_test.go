package pgstore_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/internal/testenv"
)

// TestTerminateMidDecision kills the backend that runs a decision while the
// decision waits for its row: the caller gets an error, the decision takes
// nothing (its transaction never committed), and the next decision succeeds
// on the same pool.
func TestTerminateMidDecision(t *testing.T) {
	url := pgstoretest.PostgresURL(t)
	app := "ratekit-kill-" + pgstoretest.NewSchema()
	pool := pgstoretest.Pool(t, url, 2, app)
	admin := pgstoretest.Pool(t, url, 2, "")
	s := newStore(t, pool)
	ctx := ctxT(t)
	c := newCounter(t, s, ratekit.FixedWindow, 10)
	if _, err := c.Take(ctx, "k", 1, ""); err != nil {
		t.Fatal(err)
	}
	// Hold the counter's row so the next decision blocks inside its
	// function.
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM "`+s.Schema()+`".counters_unlogged WHERE prefix = $1 FOR UPDATE`, c.cfg.Prefix); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Take(ctx, "k", 1, "")
		done <- err
	}()
	var pid int32
	for deadline := time.Now().Add(5 * time.Second); pid == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the decision never waited for the row lock")
		}
		err := admin.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&pid)
		if err != nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("decision on a terminated backend succeeded")
		}
		t.Logf("decision on terminated backend: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("decision did not return after its backend was terminated")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := c.Take(ctx, "k", 1, "")
	if err != nil {
		t.Fatalf("decision after the kill: %v", err)
	}
	if r.Remaining != 8 {
		t.Fatalf("remaining %d after 2 successful takes and a killed one, want 8", r.Remaining)
	}
}

// newToxiproxy starts an in-process toxiproxy in front of the test
// PostgreSQL server and returns it with the URL that goes through it.
func newToxiproxy(t *testing.T) (*toxiproxy.Proxy, string) {
	t.Helper()
	raw := pgstoretest.PostgresURL(t)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	proxy := toxiproxy.NewProxy(srv, "postgres", "127.0.0.1:0", u.Host)
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Stop)
	u.Host = proxy.Listen
	return proxy, u.String()
}

// TestInjectedLatency slows every reply from the server: the limiter returns
// an error within the caller's deadline, its own retry logic never counts a
// request twice, and it recovers once the latency is gone.
func TestInjectedLatency(t *testing.T) {
	proxy, url := newToxiproxy(t)
	pool := pgstoretest.Pool(t, url, 4, "")
	s := newStore(t, pool)
	ctx := ctxT(t)
	c := newCounter(t, s, ratekit.FixedWindow, 100)
	late := testenv.MeasureLateness(t)
	if _, err := c.Take(ctx, "k", 1, ""); err != nil {
		t.Fatal(err)
	}
	_, err := proxy.Toxics.AddToxicJson(strings.NewReader(`{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":800}}`))
	if err != nil {
		t.Fatal(err)
	}
	const deadline = 200 * time.Millisecond
	attempt := func(idem string) {
		t.Helper()
		actx, cancel := context.WithTimeout(ctx, deadline)
		defer cancel()
		start := time.Now()
		_, err := c.Take(actx, "k", 1, idem)
		took := time.Since(start)
		if err == nil {
			t.Fatal("decision succeeded through 800 ms of latency with a 200 ms deadline")
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("error does not match context.DeadlineExceeded: %v", err)
		}
		// 300ms of slack, and a busy machine's scheduling lateness
		// measured meanwhile: waiting for the 800ms reply still fails.
		if lateness := late.Max(); took > deadline+300*time.Millisecond+lateness {
			t.Fatalf("decision returned after %v with a %v deadline (+300ms + scheduling lateness %v)", took, deadline, lateness)
		}
	}
	// Three attempts of one invocation, and three of distinct ones. The
	// statements reach the server and may run there: each may count once.
	for i := 0; i < 3; i++ {
		attempt("invocation-1")
	}
	for i := 0; i < 3; i++ {
		attempt("")
	}
	proxy.Toxics.RemoveToxic(ctx, "slow")
	// The slowed statements finish on the server after their clients gave
	// up; wait for them before counting.
	time.Sleep(time.Second)
	r, err := c.Take(ctx, "k", 1, "invocation-1")
	if err != nil {
		t.Fatalf("decision after the latency ended: %v", err)
	}
	// Taken: 1 before; invocation-1 once (its retries are duplicates, and
	// this last attempt is one of them if any reached the server); at most
	// 3 for the attempts without idempotency key.
	used := 100 - r.Remaining
	if used < 2 || used > 5 {
		t.Fatalf("used %d units; want between 2 and 5", used)
	}
	if r2, err := c.Take(ctx, "k", 1, "invocation-1"); err != nil || r2.Remaining != r.Remaining {
		t.Fatalf("retry of invocation-1: %+v, %v", r2, err)
	}
}

// TestServerOutage cuts every connection to the server and refuses new ones
// (toxiproxy disabled; the shared server on 5432 keeps running for the other
// packages' tests), then restores it: decisions fail fast within their
// deadline and the same pool recovers without a restart.
func TestServerOutage(t *testing.T) {
	proxy, url := newToxiproxy(t)
	pool := pgstoretest.Pool(t, url, 4, "")
	s := newStore(t, pool)
	ctx := ctxT(t)
	c := newCounter(t, s, ratekit.TokenBucket, 100)
	late := testenv.MeasureLateness(t)
	if _, err := c.Take(ctx, "k", 1, ""); err != nil {
		t.Fatal(err)
	}
	proxy.Stop()
	for i := 0; i < 3; i++ {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		start := time.Now()
		_, err := c.Take(actx, "k", 1, "")
		cancel()
		if err == nil {
			t.Fatal("decision succeeded during the outage")
		}
		if took, lateness := time.Since(start), late.Max(); took > 1500*time.Millisecond+lateness {
			t.Fatalf("decision took %v with a 1 s deadline (+500ms + scheduling lateness %v)", took, lateness)
		}
	}
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	var r ratekit.Decision
	var err error
	// Recovering must happen with the same pool, not within an idle
	// machine's time: 2s attempts for up to 20s.
	for i, end := 0, time.Now().Add(20*time.Second); time.Now().Before(end); i++ {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		r, err = c.Take(actx, "k", 1, "outage-retry")
		cancel()
		if err == nil {
			break
		}
		t.Logf("attempt %d after the outage: %v", i, err)
	}
	if err != nil {
		t.Fatalf("pool did not recover: %v", err)
	}
	// One before the outage and one now: nothing the failed attempts sent
	// could reach the server.
	if r.Remaining != 98 {
		t.Fatalf("remaining %d, want 98", r.Remaining)
	}
}
