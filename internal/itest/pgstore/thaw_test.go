package pgstore_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratekit/ratekit"
	"github.com/ratekit/ratekit/durable"
	"github.com/ratekit/ratekit/durable/pgstore"
	"github.com/ratekit/ratekit/durable/pgstore/pgstoretest"
	"github.com/ratekit/ratekit/httplimit"
	"github.com/ratekit/ratekit/internal/itest/faultproxy"
	"github.com/ratekit/ratekit/internal/itest/thawtest"
)

// thawPool returns a pool of at most maxConns connections on the test
// server through relay, configured as the package documentation recommends
// for serverless functions, and closes it (then the relay) when the test
// ends.
func thawPool(t *testing.T, relay *faultproxy.Relay, maxConns int, timeout time.Duration) *pgxpool.Pool {
	t.Helper()
	u, err := url.Parse(pgstoretest.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = relay.Addr
	q := u.Query()
	q.Set("default_query_exec_mode", "exec")
	q.Set("pool_max_conns", strconv.Itoa(maxConns))
	u.RawQuery = q.Encode()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, pgstore.ServerlessPoolConfig(cfg, timeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relay.Close) // after the pool (cleanups run last-in first-out)
	t.Cleanup(pool.Close)
	return pool
}

// TestThawWithSilentConnections is a Lambda instance thawing after a NAT
// gateway dropped every pooled connection without a FIN or RST: the pool
// (ServerlessPoolConfig; two connections, as recommended, one or more) is full,
// has sat idle (frozen), and now every pooled connection swallows what it
// is sent and never answers, while new connections work. Decisions made one
// after another, each with a Guard-like deadline, must see at most one
// failure, and the first success must come within one deadline of it.
// Nothing may count twice: the server counts the successful takes, and at
// most the failed ones besides.
func TestThawWithSilentConnections(t *testing.T) {
	for _, tc := range []struct {
		maxConns int
		timeout  time.Duration // Guard.Timeout and ServerlessPoolConfig's
		guard    bool          // decide through durable behind a Guard
	}{
		{1, time.Second, false},
		{2, time.Second, false},
		{2, time.Second, true},
		{2, 2 * time.Second, false},
		{8, time.Second, false},
	} {
		name := fmt.Sprintf("pool of %d, timeout %v", tc.maxConns, tc.timeout)
		if tc.guard {
			name += ", through a Guard"
		}
		t.Run(name, func(t *testing.T) {
			testThaw(t, tc.maxConns, tc.timeout, tc.guard)
		})
	}
}

func testThaw(t *testing.T, maxConns int, timeout time.Duration, guard bool) {
	relay := faultproxy.StartRelay(t, testenvHost(t))
	pool := thawPool(t, relay, maxConns, timeout)
	s := newStore(t, pool)
	const limit = 1_000_000
	c := newCounter(t, s, ratekit.FixedWindow, limit)
	take := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := c.Take(ctx, "k", 1, "")
		return err
	}
	if err := take(10 * time.Second); err != nil { // creates the schema if needed
		t.Fatal(err)
	}
	// Fill the pool: hold every connection at once, then give them back.
	ctx := ctxT(t)
	var held []*pgxpool.Conn
	for range maxConns {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, conn)
	}
	for _, conn := range held {
		conn.Release()
	}
	if st := pool.Stat(); st.IdleConns() != int32(maxConns) {
		t.Fatalf("the pool holds %d idle connections, want %d", st.IdleConns(), maxConns)
	}
	// The freeze: longer than the idle time after which the pool pings a
	// connection before use.
	time.Sleep(1500 * time.Millisecond)
	decide := func() error { return take(timeout) }
	if guard {
		l, err := durable.New(durable.Config{Store: s, Prefix: pgstoretest.Prefix(t),
			Policy: ratekit.Policy{Name: "thaw", Quota: limit, Window: time.Hour, Algorithm: ratekit.FixedWindow}, Durability: durable.Unlogged})
		if err != nil {
			t.Fatal(err)
		}
		g, err := httplimit.NewGuard(httplimit.GuardConfig{Limiter: l, OnError: httplimit.FailClosed, Timeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		decide = func() error {
			return g.Check(context.Background(), ratekit.Request{Key: "k", Cost: 1}, http.Header{}).Err
		}
	}
	silenced := relay.Silence()

	log := thawtest.Decide(decide, func(log []thawtest.Attempt) bool {
		// Five successes in a row, within bounds.
		streak := 0
		for i := len(log) - 1; i >= 0 && log[i].Err == nil; i-- {
			streak++
		}
		return streak < 5 && len(log) < 40 && (len(log) == 0 || time.Since(log[0].Start) < 30*time.Second)
	})
	failed, recovery := thawtest.Read(t, silenced, log)
	if failed > 1 {
		t.Errorf("%d decisions failed after the thaw, want at most 1", failed)
	}
	if lim := 2*timeout + slack; recovery > lim {
		t.Errorf("first success %v after the thaw, want within %v", recovery, lim)
	}

	if guard {
		return
	}
	// Exactly the successful takes reached the server.
	direct := c.on(newStore(t, directPool(t)))
	r, err := direct.l.Peek(ctxT(t), ratekit.Request{Key: "k", Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	// A take that failed on a new connection (a loaded machine) may have
	// run on the server; none may count twice.
	if applied, ok := limit-r.Remaining, int64(1+len(log)-failed); applied < ok || applied > ok+int64(failed) {
		t.Errorf("the server counted %d takes; %d succeeded and %d failed", applied, ok, failed)
	}
}

// slack is how much later than its deadline a call may return on a loaded
// machine.
const slack = 250 * time.Millisecond

// testenvHost returns the host:port of the test PostgreSQL server.
func testenvHost(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(pgstoretest.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// directPool returns a pool straight on the test server.
func directPool(t *testing.T) *pgxpool.Pool {
	return pgstoretest.Pool(t, pgstoretest.PostgresURL(t), 2, "")
}

func TestServerlessPoolConfig(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(pgstoretest.DefaultPostgresURL)
	if err != nil {
		t.Fatal(err)
	}
	var userClose int
	cfg.BeforeClose = func(*pgx.Conn) { userClose++ }
	if got := pgstore.ServerlessPoolConfig(cfg, 0); got != cfg {
		t.Fatal("ServerlessPoolConfig returned another config")
	}
	if cfg.PingTimeout != 250*time.Millisecond/4 || cfg.MaxConnIdleTime != pgstore.ServerlessMaxConnIdleTime ||
		cfg.ShouldPing == nil || cfg.ConnConfig.DialFunc == nil {
		t.Fatalf("ServerlessPoolConfig(cfg, 0): PingTimeout %v, MaxConnIdleTime %v", cfg.PingTimeout, cfg.MaxConnIdleTime)
	}
	if pgstore.ServerlessPoolConfig(cfg, 2*time.Second).PingTimeout != 500*time.Millisecond {
		t.Fatalf("PingTimeout = %v for a 2s timeout, want 500ms", cfg.PingTimeout)
	}

	// The user's BeforeClose still runs, on the live pool.
	url := pgstoretest.PostgresURL(t)
	cfg, err = pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	userClose = 0
	cfg.BeforeClose = func(*pgx.Conn) { userClose++ }
	pool, err := pgxpool.NewWithConfig(ctxT(t), pgstore.ServerlessPoolConfig(cfg, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.Ping(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	if userClose != 1 {
		t.Fatalf("the config's own BeforeClose ran %d times for one connection, want 1", userClose)
	}
}
